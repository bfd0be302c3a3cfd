"""The privacy spent by a DP run: dp-accounting's RDP or PLD accountant for the sampled Gaussian mechanism, and
the ledger a run keeps (epsilon per round, the max_epsilon budget; docs/privacy.md "Differential privacy").

A round of server-mode DP-FedAvg is one Poisson-sampled Gaussian mechanism with sampling rate q = clients per
round / clients and noise multiplier sigma (Flower's and TensorFlow Privacy's accounting; fedhet samples a fixed
number of clients without replacement, which the Poisson bound approximates, as theirs does). Local mode gives the
server every noised update it receives, so no amplification by sampling: q = 1, each round counted.
The state is the number of DP rounds taken (ServerState.opt's dp/steps): epsilon is a function of it, so a
resumed run reports the same epsilon bit for bit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cache

from fedhet.config.privacy import DPConfig
from fedhet.errors import ConfigError
from fedhet.yaml_input import JSONDict

INSTALL = "pip install fedhet[privacy]"


Event = tuple[float, float, int]  # (sampling rate q, noise multiplier sigma, rounds): q = 1, no sampling


@cache
def epsilon(q: float, noise_multiplier: float, steps: int, delta: float, accountant: str = "rdp") -> float:
    """epsilon(delta) after `steps` rounds of the Poisson-sampled Gaussian mechanism (rate q, multiplier sigma),
    from dp-accounting's RdpAccountant (default orders) or PLDAccountant; cached (a round asks for it again when
    it checks the next one)."""
    return _compose(((q, noise_multiplier, steps),), delta, accountant)


@cache
def composed_epsilon(events: tuple[Event, ...], delta: float, accountant: str = "rdp") -> float:
    """epsilon(delta) of several sampled Gaussian mechanisms composed in one accountant (a tuning job's members,
    tune/privacy.py); cached."""
    return _compose(events, delta, accountant)


def _compose(events: tuple[Event, ...], delta: float, accountant: str) -> float:
    """epsilon(delta) of `events` composed in dp-accounting's RDP or PLD accountant (0 without a round)."""
    events = tuple(e for e in events if e[2] > 0)
    if not events:
        return 0.0
    try:
        from dp_accounting import dp_event, pld, rdp
    except ImportError as err:
        raise ConfigError(f"privacy.dp's accountant needs dp-accounting: {INSTALL}") from err
    acc = rdp.RdpAccountant() if accountant == "rdp" else pld.PLDAccountant()
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)  # "failed to converge ... excluding this order": per order, harmless, many
    try:
        for q, noise_multiplier, steps in events:
            event = dp_event.GaussianDpEvent(noise_multiplier)
            acc.compose(event if q >= 1 else dp_event.PoissonSampledDpEvent(q, event), steps)
        return float(acc.get_epsilon(delta))
    finally:
        absl.setLevel(level)


@dataclass(frozen=True)
class PrivacyLedger:
    """A DP run's accounting: epsilon after each round, and the round a budget refuses."""

    cfg: DPConfig
    q: float  # the sampling rate the accountant uses

    @classmethod
    def for_run(cls, cfg: DPConfig, num_clients: int, sampled: int) -> PrivacyLedger:
        """The ledger of a run with `num_clients` clients that may be sampled, `sampled` of them per round
        (engine.sampling.sample_size); checks delta < 1/N and that dp-accounting is installed before anything
        trains."""
        cfg.check_clients(num_clients)
        q = 1.0 if cfg.mode == "local" else sampled / num_clients
        ledger = cls(cfg, q)
        ledger.spent(1)  # fails now, not after a round, when dp-accounting is missing
        return ledger

    def spent(self, steps: int) -> float:
        """epsilon(delta) after `steps` DP rounds."""
        return epsilon(self.q, self.cfg.noise_multiplier, steps, self.cfg.delta, self.cfg.accountant)

    def refusal(self, steps: int) -> str | None:
        """Why the next round may not train (it would spend more than max_epsilon), or None."""
        budget = self.cfg.max_epsilon
        if budget is None:
            return None
        after = self.spent(steps + 1)
        if after <= budget:
            return None
        return (f"privacy budget: round {steps + 1} would spend epsilon {after:.6g} > privacy.dp.max_epsilon "
                f"{budget:g} (delta {self.cfg.delta:g}); the run stopped after round {steps}")

    def check_resume(self, steps: int) -> None:
        """A resumed run whose spent epsilon is already over max_epsilon (a budget lowered since) is refused."""
        budget, spent = self.cfg.max_epsilon, self.spent(steps)
        if budget is not None and spent > budget:
            raise ConfigError(f"this run has already spent epsilon {spent:.6g} in {steps} DP rounds, more than "
                              f"privacy.dp.max_epsilon={budget:g}; its results stay as they are. Resume with a "
                              "max_epsilon of at least that, or start a new run")

    def row(self, rnd: int, steps: int) -> JSONDict:
        """The metrics.jsonl row of round `rnd` (client 'server', split 'privacy')."""
        return {"round": rnd, "client": "server", "split": "privacy", "epsilon": self.spent(steps),
                "delta": self.cfg.delta, "dp_rounds": steps}

    def facts(self, steps: int, stopped: str | None) -> JSONDict:
        """summary.json's `privacy` entry."""
        return {"privacy": {"mode": self.cfg.mode, "epsilon": self.spent(steps), "delta": self.cfg.delta,
                            "dp_rounds": steps, "q": self.q, "noise_multiplier": self.cfg.noise_multiplier,
                            "accountant": self.cfg.accountant, "max_epsilon": self.cfg.max_epsilon,
                            "stopped": stopped}}
