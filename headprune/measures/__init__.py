"""The measurements the experiments run on the task protocol: masks scored one or many at a time, single-head ablation, keep-one, speed."""
