"""The batched runtime (`run.runtime: batched`): many simulated clients' local training in one vectorized step.

One concept per module:
- `rule`: which fits are vectorized (the algorithm's own `LossStep`s, re-routable per client), and the refusal;
- `step`: the algorithm's loss evaluated with one lane's tensors, its gradient, optimizer update, and vmap;
- `optim`: SGD (momentum, weight decay) and Adam/AdamW as pure functions, matching torch.optim;
- `norm`: BatchNorm whose running statistics are returned, not written in place;
- `data`: each client's mini-batches drawn as in-process (same order and augmentation);
- `lanes`: one pass of many clients in lock-step, lanes grouped by batch size;
- `memory`: how many clients fit one chunk under the memory budget;
- `runtime`: `BatchedClients`, the executor the round loop uses (interface of `InProcessClients`).

See docs/runtimes_batched.md.
"""

from fedhet.runtimes.batched.runtime import BatchedClients

__all__ = ["BatchedClients"]
