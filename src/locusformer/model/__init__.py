"""The network (torch only: attention, losses, network, config) and the trained model's files."""
