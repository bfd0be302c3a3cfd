"""Parameter-efficient fine-tuning building blocks for FedDAT (Chen et al., AAAI 2024) and its baselines.

- adapters: `BottleneckAdapter` (Eq. 1) and `DualAdapter` (slots A_s, Â_s, A_c; paths "shared", "dat" (Eq. 4),
  "client", "frozen_shared", "none").
- insertion: `insert_adapters` after the FFN output of every block of any HF-style encoder, path switching,
  `refresh_frozen_copy` (Â_s <- A_s), per-slot parameters and state.
- lora (`peft`), prompt (10 visual + 10 text tokens), counting (`peft_parameters` / `mark_trainable`: what each
  method trains and communicates, with counts for the "Comm. Overhead" column). See docs/models/peft.md.
"""

from fedhet.models.peft.adapters import (
    CLIENT,
    FROZEN,
    INITS,
    PATHS,
    SHARED,
    SLOTS,
    BottleneckAdapter,
    DualAdapter,
    adapter_param_count,
    bottleneck_size,
)
from fedhet.models.peft.counting import (
    KINDS,
    PeftParameters,
    format_count,
    mark_trainable,
    param_group,
    peft_parameters,
)
from fedhet.models.peft.insertion import (
    ADAPTER_ATTR,
    adapter_modules,
    adapter_named_parameters,
    adapter_parameters,
    adapter_path,
    adapter_state,
    find_ffn_outputs,
    get_adapter_path,
    insert_adapters,
    load_adapter_state,
    refresh_frozen_copy,
    set_adapter_path,
)
from fedhet.models.peft.lora import apply_lora, lora_param_count, lora_targets
from fedhet.models.peft.prompt import PROMPT_ATTR, PromptTokens, add_prompts, prompt_host, prompts_of, splice_prompts

__all__ = [
    "ADAPTER_ATTR", "CLIENT", "FROZEN", "INITS", "KINDS", "PATHS", "PROMPT_ATTR", "SHARED", "SLOTS",
    "BottleneckAdapter", "DualAdapter", "PeftParameters", "PromptTokens",
    "adapter_modules", "adapter_named_parameters", "adapter_param_count", "adapter_parameters", "adapter_path",
    "adapter_state", "add_prompts", "apply_lora", "bottleneck_size", "find_ffn_outputs", "format_count",
    "get_adapter_path", "insert_adapters", "load_adapter_state", "lora_param_count", "lora_targets",
    "mark_trainable", "param_group", "peft_parameters", "prompt_host", "prompts_of", "refresh_frozen_copy",
    "set_adapter_path", "splice_prompts",
]
