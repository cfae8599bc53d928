"""Catalogue of GPUs and bundled model configs (data files under ``data/``)."""

from apmw.catalog.gpus import GpuSpec, get_gpu, gpu_names
from apmw.catalog.models import load_config, model_names, resolve_model_name

__all__ = ["GpuSpec", "get_gpu", "gpu_names", "load_config", "model_names",
           "resolve_model_name"]
