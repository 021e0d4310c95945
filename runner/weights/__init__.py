"""Weights in: pretrained weights from the Hugging Face Hub, files of weights, "auto" preprocessing (a run's weights
go out through runner.export, a layer above: it reads the model and validation data).

Modules, in import order:
    hub       timm's pretrained weights through huggingface_hub: the cache, one download per node, the offline
              message, provenance (repo, revision, sha256)
    files     weights from a file (a runner checkpoint, a state_dict, .safetensors) checked against a model
    preprocess   "auto" DATA.MEAN, DATA.STD, AUG.INTERPOLATION and EVAL.CROP_PCT from the weights' pretrained config
"""
