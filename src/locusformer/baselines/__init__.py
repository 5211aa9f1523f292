"""Established correctors run beside LocusFormer: ComBat, Harmony, scVI, SysVI."""
