"""Managed spot training on SageMaker, with the script under ``prudent run``.

Run ``python launch.py`` from this folder (``pip install sagemaker``), with ``train.py`` next
to ``entry.sh``: SageMaker uploads the folder, installs ``requirements.txt`` and runs
``entry.sh``, which starts ``prudent run``.

``checkpoint_s3_uri`` <-> ``/opt/ml/checkpoints``: SageMaker copies the bucket's prefix into
that folder when the job (re)starts and uploads what is written there while it runs. On
SageMaker prudent writes its checkpoints to ``/opt/ml/checkpoints/<run id>`` by default, so a
job restarted after a spot interruption (same job name, same run id) resumes exactly.
SageMaker also mirrors deletions to S3, which is what prudent's ``checkpoint.keep`` relies on.
"""

from __future__ import annotations

import time

ROLE = "arn:aws:iam::123456789012:role/SageMakerTrainingRole"
BUCKET = "s3://my-bucket"


def main() -> None:
    from sagemaker.pytorch import PyTorch  # here, not at the top: this file parses without it

    job_name = f"prudent-train-{time.strftime('%Y%m%d-%H%M%S')}"  # also prudent's run id
    estimator = PyTorch(
        entry_point="entry.sh",
        source_dir=".",
        role=ROLE,
        framework_version="2.3",
        py_version="py311",
        instance_type="ml.g5.xlarge",
        instance_count=1,
        use_spot_instances=True,
        max_run=24 * 3600,  # seconds of training
        max_wait=48 * 3600,  # >= max_run: training plus waiting for spot capacity
        checkpoint_s3_uri=f"{BUCKET}/prudent-checkpoints/{job_name}",
        checkpoint_local_path="/opt/ml/checkpoints",  # the default, where prudent writes
        output_path=f"{BUCKET}/output",
    )
    estimator.fit(job_name=job_name, wait=False)
    print(f"started {job_name}: prudent show {job_name} inside the job, or CloudWatch logs")


if __name__ == "__main__":
    main()
