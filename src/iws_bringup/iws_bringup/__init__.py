"""Launch files and the iws command line: start the reference robot, the world model or nothing (real hardware) on a robot profile's topics."""
