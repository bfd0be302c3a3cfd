"""The one round driver. `fedhet run` (engine/loop.py's `RoundLoop`: one federation) and `fedhet tune`
(tune/run.py's `TuningJob`: one run whose round trains a population) play their rounds through it.

A round is played (`play`: train, evaluate), then committed as a whole (`commit`: the round counter, the time
spent, the checkpoint and metrics the body writes) with Ctrl-C / SIGTERM held back (`StopSignals.deferred`), so
an interrupt leaves either all of round r on disk or none of it. An interrupt, a failed round (`ClientsFailed`)
or a diverged one returns the body to its last commit (`restore`, which writes that round's checkpoint when the
file on disk is older), then the job stops: `Interrupted` after Ctrl-C / SIGTERM (continue with --resume), the
error itself otherwise. `on_phase(phase, round)`, if given, is called at every phase boundary (start, then the
body's own, e.g. trained, evaluated, committed, checkpoint_saved, metrics_written; end): tests inject signals
there deterministically.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from tqdm.auto import tqdm

from fedhet.engine.executor import ClientsFailed
from fedhet.engine.signals import StopSignals
from fedhet.errors import FedhetError, TrainingDivergedError

log = logging.getLogger(__name__)
PhaseHook = Callable[[str, int], None]
R = TypeVar("R")


class Interrupted(FedhetError):
    """The run was stopped by Ctrl-C or SIGTERM after a checkpoint was written."""

    exit_code = 130  # as a shell reports a process stopped by SIGINT


class RoundDriver(Generic[R]):
    """Plays rounds `round + 1 ..` of a body (a subclass: `play`, `commit`, `restore`, `finish`, `status`) up
    to the last round or `stop_after`, commits each, and stops cleanly at a signal or a failure."""

    def __init__(self, label: str, rounds: int, checkpoint_file: Path, progress: bool,
                 on_phase: PhaseHook | None = None) -> None:
        self.label, self.rounds, self.checkpoint_file = label, rounds, checkpoint_file
        self.progress, self.on_phase = progress, on_phase
        self.round, self.elapsed = 0, 0.0  # the last committed round and the seconds its rounds took
        self.stop_reason: str | None = None  # why the job ends before its last round (None: it does not)

    def _phase(self, name: str, rnd: int) -> None:
        if self.on_phase is not None:
            self.on_phase(name, rnd)

    # -------------------------------------------------------------- what a body supplies
    def play(self, rnd: int) -> float | None:
        """Train and evaluate round `rnd`, keeping what is needed to undo it (`restore`); returns the round's
        test accuracy if it was evaluated (a plain run's)."""
        raise NotImplementedError

    def commit(self, rnd: int, last: int) -> None:
        """Round `rnd` is complete (`round` and `elapsed` count it already): its checkpoint and metrics."""
        raise NotImplementedError

    def restore(self) -> None:
        """Return to the last commit after a stop, with its checkpoint on disk."""
        raise NotImplementedError

    def finish(self) -> R:
        """The result once the rounds are played (or `stop_after` came first)."""
        raise NotImplementedError

    def status(self) -> str | None:
        """The progress bar's text after a round (None: leave it)."""
        return None

    def stopped(self) -> bool:
        """Whether the job ends before its last round (tune: every configuration diverged; a run: `stop_reason`,
        e.g. its privacy budget)."""
        return self.stop_reason is not None

    def after_commit(self, rnd: int, seconds: float) -> None:
        """Round `rnd` is committed and took `seconds` (trackers)."""

    # -------------------------------------------------------------- the driver
    def play_round(self, rnd: int, last: int, signals: StopSignals) -> float | None:
        """Play round `rnd`, then commit it as a whole with signals held back; returns what `play` did."""
        start = time.perf_counter()
        self._phase("start", rnd)
        acc = self.play(rnd)
        with signals.deferred():
            self.elapsed += time.perf_counter() - start
            self.round = rnd
            self.commit(rnd, last)
        self.after_commit(rnd, time.perf_counter() - start)
        self._phase("end", rnd)
        return acc

    def drive(self, stop_after: int | None = None) -> R:
        """Play the remaining rounds (up to `stop_after`), then `conclude`."""
        last = self.rounds if stop_after is None else min(self.rounds, stop_after)
        bar = tqdm(total=self.rounds, initial=self.round, desc=self.label, disable=not self.progress, unit="round",
                   dynamic_ncols=True, leave=True)
        self._show(bar)
        with StopSignals() as signals:
            try:
                while self.round < last and not self.stopped():
                    self.play_round(self.round + 1, last, signals)
                    bar.update(1)
                    self._show(bar)
            except KeyboardInterrupt as err:
                bar.close()
                with signals.deferred(reraise=False):  # a further Ctrl-C waits for the checkpoint
                    self.restore()
                raise Interrupted(f"interrupted after round {self.round}; checkpoint written to "
                                  f"{self.checkpoint_file}. Continue with --resume.") from err
            except (ClientsFailed, TrainingDivergedError) as err:
                bar.close()
                with signals.deferred(reraise=False):
                    self.restore()
                if isinstance(err, TrainingDivergedError):
                    log.info("training diverged in round %d; the checkpoint of round %d is in %s",
                             self.round + 1, self.round, self.checkpoint_file)
                raise
            bar.close()
            return self.conclude(signals)

    def conclude(self, signals: StopSignals) -> R:
        """`finish` with signals held back (its files are written whole, then a Ctrl-C / SIGTERM stops)."""
        try:
            with signals.deferred():
                return self.finish()
        except KeyboardInterrupt as err:
            raise Interrupted(f"interrupted as the run finished; its results are complete in "
                              f"{self.checkpoint_file.parent.parent}") from err

    def _show(self, bar: tqdm) -> None:  # type: ignore[type-arg]
        text = self.status()
        if text is not None:
            bar.set_postfix_str(text)
