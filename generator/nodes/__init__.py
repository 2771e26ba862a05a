"""The node layer: a python-on-whales client per node and the operations shared by every command
(Fleet), images moved between nodes, secrets written on them, the engines' events, surveys of what
runs, the served model's own answers, the hardware's facts judged. Below it: base, config, stack."""
