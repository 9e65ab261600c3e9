"""Robot interaction data: rosbag2 recorder, play-data collection, dataset builder and cached dataset format."""
