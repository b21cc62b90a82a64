"""Checkpoints that survive a killed worker: ``torch.distributed.checkpoint`` every N steps, written
so that the previous checkpoint stays valid until the new one is complete.

A checkpoint holds what the next step depends on: the weights, the optimizer's state, the epoch
and the step within it (the data order is ``randperm`` seeded by the epoch, so the epoch and the
step within it are all the order needs), and the losses recorded so far. Resuming from it gives
the same final weights, bit for bit, as a run that was never stopped.

Each rank records its own local batch's loss, but a checkpoint holds the mean over the ranks:
DCP takes a plain tensor that every rank saves under one key for a replicated one, writes one
rank's copy and hands it to every rank on load, and the world size may change at a restart.

On disk, under ``root``::

    step-000008/          a complete checkpoint (DCP's .metadata and one .distcp file per writer)
    step-000012/
    LATEST                "step-000012": the checkpoint to resume from
    .step-000016.partial/ a save in progress, or what a killed one left

A save writes into ``.step-NNNNNN.partial/``, renames it to ``step-NNNNNN/`` (atomic) once every
rank has written its part, then points ``LATEST`` at it (``atomic_write``: a rename again), then
removes the oldest beyond ``keep``. A kill at any moment leaves ``LATEST`` naming a complete
checkpoint; the next start removes the partial folder. Every rank must see the same ``root``:
one machine's disk, or a shared file system across nodes. Rank 0 reads ``LATEST`` and tells the
others which checkpoint to load; a rank that cannot see it stops every rank with a
``CheckpointError``, rather than start from step 0 while rank 0 resumes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from helpers.data.files import atomic_write, fsync_folder, remove_stale
from helpers.dist.collectives import mean_over_ranks

LATEST = "LATEST"
RUN_FILE = "run.json"  # what run the checkpoints belong to, to refuse resuming another one
_NAME = re.compile(r"^step-(\d{6,})$")


class CheckpointError(RuntimeError):
    """A checkpoint folder that cannot be resumed from; the message says what to do."""


@dataclass(frozen=True)
class Fault:
    """A fault drill: rank ``rank`` kills itself with SIGKILL after step ``step`` (or, with
    ``during_save``, in the middle of saving the checkpoint of that step: after its files are
    written, before the rename that completes it). Only on a run's first attempt, so that a
    restarted group runs through."""

    rank: int
    step: int
    during_save: bool = False

    @classmethod
    def parse(cls, text: str) -> Fault:
        """``RANK:STEP`` or ``RANK:STEP:save``."""
        parts = text.split(":")
        if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[:2]):
            raise ValueError(f"a fault is RANK:STEP or RANK:STEP:save, got {text!r}")
        if len(parts) == 3 and parts[2] != "save":
            raise ValueError(f"a fault is RANK:STEP or RANK:STEP:save, got {text!r}")
        if int(parts[1]) < 1:
            raise ValueError(f"a fault's step counts from 1, got {parts[1]}")
        return cls(int(parts[0]), int(parts[1]), len(parts) == 3)

    def __str__(self) -> str:
        return f"{self.rank}:{self.step}" + (":save" if self.during_save else "")


def first_attempt() -> bool:
    """True unless torchrun has restarted the worker group (``TORCHELASTIC_RESTART_COUNT``)."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def latest(root: Path) -> Path | None:
    """The complete checkpoint ``LATEST`` names, or None if there is none yet. ``LATEST`` must
    hold the bare name of a step folder inside ``root`` (``step-000012``), nothing else."""
    pointer = Path(root) / LATEST
    if not pointer.exists():
        return None
    name = pointer.read_text().strip()
    path = Path(root) / name
    if not _NAME.match(name) or not (path / ".metadata").exists():
        raise CheckpointError(
            f"{pointer} names {name!r}, which is not a complete checkpoint in {root}; "
            f"remove {root} to start afresh"
        )
    return path


def saved_steps(root: Path) -> list[int]:
    """The steps of the complete checkpoints under ``root``, in order."""
    found = (_NAME.match(p.name) for p in Path(root).glob("step-*"))
    return sorted(int(m.group(1)) for m in found if m)


@dataclass(frozen=True)
class CheckpointSpec:
    """Where and how often a training saves, and an optional fault drill. Plain data, so that
    it can be sent to spawned workers."""

    root: str
    every: int  # steps between checkpoints (the last step is always saved)
    keep: int = 2  # complete checkpoints kept; older ones are removed
    fault: Fault | None = None

    def __post_init__(self) -> None:
        if self.every < 1 or self.keep < 1:
            raise ValueError(
                f"checkpoint every and keep must be at least 1, got {self.every} and {self.keep}"
            )


class Checkpointer:
    """Saves and restores one training's state; ``helpers.training.train_steps`` calls it."""

    def __init__(self, spec: CheckpointSpec, run: dict, rank: int = 0):
        self.spec, self.run, self.rank = spec, run, rank
        self.root = Path(spec.root)
        self.resumed_from = 0  # the global step this process started at
        self.saved: list[int] = []  # steps this process saved

    def _state(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        losses: torch.Tensor,
        epoch: int,
        step_in_epoch: int,
        step: int,
    ) -> dict:
        # DCP here, not at the top: it imports DTensor, a second a worker, and a training that
        # never checkpoints has no use for it
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(model, optimizer)
        return {
            "model": model_state,
            "optimizer": optimizer_state,
            "progress": {"epoch": epoch, "step_in_epoch": step_in_epoch, "step": step},
            "losses": losses,
        }

    def restore(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        losses: torch.Tensor,
        steps_per_epoch: int,
    ) -> int:
        """Load the latest checkpoint, if any, into ``model``, ``optimizer`` and ``losses``;
        return the global step to continue from (0 without one). Rank 0 removes what a killed
        save left behind and chooses the checkpoint; every rank resumes from that one, or every
        rank raises ``CheckpointError``."""
        path = self._agreed_latest()
        if path is None:
            return 0
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._state(model, optimizer, losses, 0, 0, 0)
        dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )
        progress = state["progress"]
        if progress["step"] != progress["epoch"] * steps_per_epoch + progress["step_in_epoch"]:
            raise CheckpointError(f"{path} has inconsistent progress {progress}; remove it")
        self.resumed_from = progress["step"]
        return self.resumed_from

    def _agreed_latest(self) -> Path | None:
        """Rank 0's latest checkpoint, the same for every rank: on nodes without a shared
        folder, each reading its own ``LATEST`` could resume some ranks and not others."""
        choice: tuple[str | None, str | None] = (None, None)  # (error, checkpoint name)
        if self.rank == 0:
            try:
                self._tidy()
                self._check_run()
                found = latest(self.root)
                choice = (None, found.name if found else None)
            except CheckpointError as err:
                choice = (str(err), None)
            except OSError as err:
                choice = (f"cannot write checkpoints in {self.root} ({err.strerror or err}); "
                          "choose a folder every rank can write", None)  # fmt: skip
        if dist.is_initialized():  # every rank raises, or none (nobody reads while rank 0 tidies)
            shared = [choice]
            dist.broadcast_object_list(shared, src=0)
            choice = shared[0]
        error, name = choice
        if error:
            raise CheckpointError(error)
        if name is None:
            return None
        path = self.root / name
        missing = [] if (path / ".metadata").exists() else [self.rank]
        if dist.is_initialized():
            every: list[list[int]] = [[] for _ in range(dist.get_world_size())]
            dist.all_gather_object(every, missing)
            missing = sorted(r for ranks in every for r in ranks)
        if missing:
            raise CheckpointError(
                f"rank 0 resumes from {path}, which rank(s) {', '.join(map(str, missing))} "
                "cannot see: every rank must see the same checkpoint folder (one machine's "
                "disk, or a file system shared by every node)"
            )
        return path

    def _tidy(self) -> None:
        """Remove what killed saves left: a partial step folder, a half-written LATEST or run
        file (``atomic_write``'s temporary files)."""
        self.root.mkdir(parents=True, exist_ok=True)
        remove_stale(self.root, [".step-*.partial", f".{LATEST}.*.tmp", f".{RUN_FILE}.*.tmp"])

    def _check_run(self) -> None:
        """Refuse to resume another run's checkpoints (another batch, lr, seed or data)."""
        file = self.root / RUN_FILE
        if file.exists():
            saved = json.loads(file.read_text())
            if saved != self.run:
                changed = sorted(
                    k for k in self.run.keys() | saved.keys() if saved.get(k) != self.run.get(k)
                )
                raise CheckpointError(
                    f"the checkpoints in {self.root} are from another run (it differs in "
                    f"{', '.join(changed)}): choose another checkpoint folder, or remove it"
                )
        else:
            atomic_write(file, lambda f: f.write(json.dumps(self.run, indent=1).encode()))

    def after_step(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        losses: torch.Tensor,
        step: int,
        steps_per_epoch: int,
        total_steps: int,
    ) -> None:
        """Called after every optimizer step (``step`` counts the steps done): save every
        ``spec.every`` steps and at the end; run the fault drill if this is its step."""
        fault = self.spec.fault
        drill = fault is not None and fault.step == step and fault.rank == self.rank
        drill = drill and first_attempt()
        if drill and not fault.during_save:  # type: ignore[union-attr]
            _kill()
        if step % self.spec.every == 0 or step == total_steps:
            epoch, within = divmod(step, steps_per_epoch)
            # the same on every rank, so that saving them as one replicated tensor loses nothing
            state = self._state(model, optimizer, mean_over_ranks(losses), epoch, within, step)
            self.save(state, step, kill_before_rename=drill)

    def save(self, state: dict, step: int, kill_before_rename: bool = False) -> Path:
        """Write ``state`` as the checkpoint of ``step``: into a partial folder, then renamed,
        then named in ``LATEST``. Every rank calls it (DCP's save is a collective)."""
        final = self.root / step_name(step)
        partial = self.root / f".{final.name}.partial"
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
        _barrier()
        import torch.distributed.checkpoint as dcp

        # every rank writes its part, then rank 0 the .metadata that makes it readable
        dcp.save(state, checkpoint_id=partial, no_dist=not dist.is_initialized())
        if kill_before_rename:
            _kill()
        _barrier()  # every rank has written its part
        if self.rank == 0:
            shutil.rmtree(final, ignore_errors=True)  # a leftover of an earlier attempt
            fsync_folder(partial)  # DCP flushes its files, not their names in the folder
            os.rename(partial, final)  # made durable by atomic_write's flush of the root
            atomic_write(self.root / LATEST, lambda f: f.write(final.name.encode()))
            for old in saved_steps(self.root)[: -self.spec.keep]:
                shutil.rmtree(self.root / step_name(old), ignore_errors=True)
        _barrier()  # nobody runs ahead of a save that is not yet complete
        self.saved.append(step)
        return final
