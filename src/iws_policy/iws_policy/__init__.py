"""Diffusion Policy on camera images and joint states, trained from iws datasets; its ROS node and evaluation."""
