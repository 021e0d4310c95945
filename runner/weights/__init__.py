"""Weights in and out: pretrained weights from the Hugging Face Hub, and a run's weights exported.

Modules, in import order:
    hub       timm's pretrained weights through huggingface_hub: the cache, one download per node, the offline
              message, provenance (repo, revision, sha256)
    files     weights from a file (a runner checkpoint, a state_dict, .safetensors) checked against a model
    export    tools/export.py: a checkpoint as a Hugging Face folder (timm's local-dir:), safetensors, ONNX or a
              torch.export program, each verified against the checkpoint on validation images
"""
