#!/bin/sh
# SageMaker runs this in the training container (the estimator's entry_point, see launch.py),
# with the hyperparameters as arguments. A spot interruption restarts the same training job:
# TRAINING_JOB_NAME, hence the run id, stays the same, and SageMaker has copied
# checkpoint_s3_uri back into /opt/ml/checkpoints, where prudent keeps this run's checkpoints
# (/opt/ml/checkpoints/<run id>), so the run continues from the newest one.
exec prudent run --run-id "$TRAINING_JOB_NAME" --max-restarts 2 -- python train.py "$@"
