"""Action-conditioned consistency-model world model (encoder, consistency decoder, consistency latent dynamics, joint-state head): training, evaluation, inference. Imports no ROS."""
