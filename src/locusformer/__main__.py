import sys

from locusformer.cli.main import main

sys.exit(main())
