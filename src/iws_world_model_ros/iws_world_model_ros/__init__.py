"""The world model as a ROS 2 robot: a thin rclpy adapter over iws_world_model."""
