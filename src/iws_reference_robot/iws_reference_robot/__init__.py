"""MuJoCo reference arm on a table with a top-down camera (push_t, rope, pile), served over the ROS interface of a ros2_control arm with a RealSense."""
