"""Membership inference: how much a trained model's outputs give away which samples it was trained on.

FedBiP's Table 4 (spec: ../shared/specs/fedbip.md §2.7 (iii) and §5 "Table 4") reports, for the final model,
the difference between its average loss (and average prediction entropy) on training members and on
non-members, following Yeom et al. 2018 ("Privacy risk in machine learning: analyzing the connection to
overfitting", CSF) and Salem et al. 2018 (ML-Leaks). Lower is better privacy. This package computes that gap
for any run's deployed models, plus the standard threshold attacks built on the same scores (Yeom et al.'s
loss threshold; Song & Mittal 2021, "Systematic evaluation of privacy risks of machine learning models",
USENIX Security, for the entropy, modified-entropy and confidence thresholds): the best-threshold balanced
attack accuracy, the membership advantage and the AUC.

Modules, one concept each (import them directly; this file stays free of torch so `fedhet --help` is fast):
- `scores`: per-sample scores of a model on a dataset (loss, entropy, modified entropy, true-class confidence);
- `attacks`: threshold attacks on two score lists (gap, best-threshold accuracy / advantage, AUC);
- `membership`: the full report of one model on (members, non-members), and client averages;
- `rundir`: the entry point on a run directory (`evaluate_run`) or an experiment (`evaluate_experiment`),
  writing privacy.json;
- `uploads`: a client's real upload of one round from a run's checkpoint, as the server sees it;
- `server_view`: membership inference on the uploads (`--view server`);
- `inversion`, `invert_run`, `image_quality`: reconstructing a client's images from its upload (DLG, inverting
  gradients) and scoring them (PSNR, SSIM) (`--attack inversion`);
- `command`: the `fedhet privacy RUN_DIR` subcommand.

docs/privacy.md explains the definitions and how to read the numbers.
"""
