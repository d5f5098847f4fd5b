"""The model-compatibility pipeline: `python -m torch_tpu.compat` (see __main__.py)."""
