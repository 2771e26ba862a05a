"""What the tests and the demo stand on: the multi-node testbed, the images and model they build,
configs and CLI runs on it, and the test-only stand-ins (named as such in each file)."""
