"""Run torchtitan 0.3.0's own trainer (`python -m torchtitan.train`) on CPU, unmodified, as a
torchrun script: the way the tests drive torchtitan through `tierpoint://` where no GPU is lent.

    torchrun --standalone --nproc_per_node=2 cpu_launch.py \\
        --module llama3 --config llama3_debugmodel --parallelism.spmd-backend partial_dtensor \\
        --checkpoint.enable --checkpoint.folder tierpoint://my-job --checkpoint.interval 2 ...

Checkpointing needs none of this: on a GPU machine `python -m torchtitan.train
--checkpoint.folder tierpoint://<job>` saves and resumes through tierpoint as it is. What this
launcher changes, in this process only (no file of torchtitan is edited), and why:

1. Device. torchtitan takes CUDA when it finds no accelerator (`tools.utils.device_type`), so the
   device becomes "cpu" and `device_module` torch.cpu plus the CUDA-only calls torchtitan makes
   (set_device, memory stats for its metrics). This must happen before the trainer is imported.
2. Attention. torchtitan's language models accept only FlexAttention, which has no backward on
   CPU: its kernel is replaced by dense scaled-dot-product attention over the same block mask
   (`create_mask` of the block mask's `mask_mod`), the same block-causal attention. The block
   mask is built eagerly rather than by torch.compile, which would compile C++ with gcc on every
   fresh machine for a mask that only its `mask_mod` is used of here.
3. `torch.distributed.set_timeout`, which torchtitan calls and torch 2.13 lacks: the c10d
   function it stands for.
4. gloo has no PREMUL_SUM, which FSDP2 uses for torchtitan's gradient divide factor of 1.0:
   on CPU the reduce-scatter sums instead (the same result with a factor of 1).

torchtitan also imports triton unconditionally (install it; it imports without a GPU), and its
debug model reads `./tests/assets` (a tokenizer and the `c4_test` data set), which its wheel does
not ship: `make_assets.py` writes small ones. With more than one rank pass
`--parallelism.spmd-backend partial_dtensor` (the default backend cannot shard on CPU).
"""

from __future__ import annotations

import runpy
import sys
import types
from typing import Any

import torch


class _CpuDeviceModule(types.ModuleType):
    """torch.cpu, plus the CUDA calls torchtitan makes on its device module."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def set_device(device: Any) -> None:
        pass

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def get_device_properties(device: Any = None) -> Any:
        return types.SimpleNamespace(total_memory=16 << 30, name="cpu")

    @staticmethod
    def memory_stats(device: Any = None) -> dict[str, int]:
        return {}

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def synchronize(device: Any = None) -> None:
        pass


def _use_cpu() -> None:
    import torchtitan.tools.utils as tt_utils  # the first torchtitan import

    tt_utils.device_type = "cpu"
    tt_utils.device_module = _CpuDeviceModule("cpu_device_module")


def _dense_attention() -> None:
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import AuxOutput, create_block_mask, create_mask
    from torchtitan.models.common import attention

    def flex_attention_on_cpu(
        q: Any,
        k: Any,
        v: Any,
        *,
        score_mod: Any,
        block_mask: Any,
        scale: Any,
        enable_gqa: bool,
        return_aux: Any,
        kernel_options: Any,
    ) -> tuple[Any, Any]:
        if score_mod is not None:
            raise NotImplementedError("the CPU launcher supports FlexAttention without score_mod")
        batch, heads, length, head_dim = q.shape
        mask = create_mask(block_mask.mask_mod, batch, 1, length, k.shape[-2], device=q.device)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa
        )
        lse = None
        if getattr(return_aux, "lse", False):
            keys = k.repeat_interleave(heads // k.shape[1], dim=1) if enable_gqa else k
            scores = (q @ keys.transpose(-1, -2)) * (scale if scale is not None else head_dim**-0.5)
            lse = scores.masked_fill(~mask, float("-inf")).logsumexp(-1)
        return out, AuxOutput(lse=lse)

    attention.FlexAttention.compiled_flex_attn = staticmethod(flex_attention_on_cpu)
    attention._compiled_create_block_mask = create_block_mask


def _set_timeout() -> None:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    if not hasattr(dist, "set_timeout"):

        def set_timeout(timeout: Any, group: Any = None) -> None:
            distributed_c10d._set_pg_timeout(timeout, group)

        dist.set_timeout = set_timeout


def _sum_on_gloo() -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives

    original = collectives._get_gradient_divide_factors

    def divide_factors(
        reduce_scatter_group: Any,
        all_reduce_group: Any,
        reduce_dtype: Any,
        device_type: str = "",
        factor: Any = None,
        force_sum_reduction_for_comms: bool = False,
    ) -> Any:
        force = force_sum_reduction_for_comms or device_type == "cpu"
        return original(
            reduce_scatter_group, all_reduce_group, reduce_dtype, device_type, factor, force
        )

    collectives._get_gradient_divide_factors = divide_factors


def main() -> None:
    _use_cpu()
    _dense_attention()
    _set_timeout()
    _sum_on_gloo()
    sys.argv[0] = "torchtitan.train"
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
