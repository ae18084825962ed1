"""What the experiments compose: settings and their checks, evaluation on the task protocol, and the stages."""
