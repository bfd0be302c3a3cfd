"""The batched runtime (`run.runtime: batched`): many simulated clients' local training in one vectorized step.

One concept per module:
- `optim`: SGD (momentum, weight decay) and Adam/AdamW as pure functions, matching torch.optim;
- `norm`: BatchNorm with masked batch statistics whose running statistics are returned, not written in place;
- `step`: the client step as a pure function of (parameters, buffers, optimizer state, batch), and its vmap;
- `data`: each client's mini-batches drawn as in-process (same order and augmentation), padded and stacked;
- `lanes`: many clients trained in lock-step, ragged step counts and batch sizes handled by masking;
- `memory`: how many clients fit one chunk under the memory budget;
- `runtime`: `BatchedClients`, the executor the round loop uses (interface of `InProcessClients`).

See docs/runtimes_batched.md.
"""

from fedhet.runtimes.batched.runtime import BatchedClients

__all__ = ["BatchedClients"]
