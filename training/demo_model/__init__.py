"""Train and evaluate the bundled demo model (its checkpoint lives in `inference/demo_model/weights`)."""
