"""Checkpointer: the component that saves the run's complete state and resumes from it.

What a checkpoint holds: every object attached to the run (``state_dict()`` of models,
optimizers, schedulers, GradScalers, any stateful object), the run's counters and data
position, the RNG states, and every component's state. It is restored when the run starts
(counters), when each object is attached (its state), and when training resumes (RNG and
data position, see ``prudent.kernel.data``).

Models and their optimizers are saved through DCP in every parallelism
(``prudent.checkpoint.sharded``): rank 0's writer writes replicated state (one process, DDP)
once; with sharded (FSDP2) state every rank writes its own shards.

Under torchrun every rank takes part in each save, at the same step: rank 0's schedule
proposes a periodic save, the ranks agree on it at the next step (``prudent.distributed.torchrun``),
and each rank hands its own generators and epoch position to rank 0, which writes the files
(``prudent.checkpoint.ranks``). Epoch-end saves follow rank 0's decision; stop saves follow
the agreed stop.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

import torch

from prudent.checkpoint.objects import check_saveable, restore_object, state_of
from prudent.checkpoint.portable import (
    needs_translation,
    restore_whole_module,
    restore_whole_optimizer,
    sharded_owner,
)
from prudent.checkpoint.ranks import check_world_change, rank_state, restore_rank_state, world_of
from prudent.checkpoint.schedule import SaveSchedule
from prudent.checkpoint.settings import CheckpointSettings
from prudent.checkpoint.sharded import (
    SHARDS_SUFFIX,
    corrupted_shards,
    dcp_entries,
    holds_shards,
    is_sharded_entry,
    load_sharded,
    module_pairs,
    save_sharded,
    sharded_objects,
    shards_folder_of,
)
from prudent.checkpoint.storage import (
    CheckpointStorage,
    checkpoint_name,
    default_location,
    open_storage,
    step_of,
)
from prudent.checkpoint.writer import CheckpointWriter, SaveResult, load_checkpoint, load_latest
from prudent.distributed.elastic import record_membership
from prudent.distributed.torchrun import ranks_from_env
from prudent.kernel.errors import ConfigError
from prudent.kernel.events import Component, Event, EventKind
from prudent.kernel.pace import StepPace
from prudent.kernel.rng import kept_torch_state
from prudent.kernel.stop import StopKind
from prudent.launch.spec import host_name

if TYPE_CHECKING:
    from prudent.kernel.context import RunContext
    from prudent.kernel.stop import StopReason

__all__ = ["Checkpointer"]

class Checkpointer(Component):
    name = "checkpoint"

    def __init__(self, settings: CheckpointSettings | None = None, *, quiet: bool = False,
                 stream: TextIO | None = None) -> None:
        self.settings = settings or CheckpointSettings()
        self.quiet = quiet
        self._stream = stream
        self.schedule = SaveSchedule(self.settings.every, self.settings.at_epoch_end,
                                     self.settings.mtbi)
        self.storage: CheckpointStorage | None = None
        self.writer: CheckpointWriter | None = None
        self.resumed_from: str | None = None
        self.resumed_hosts: list[str] | None = None  # each rank's machine, as saved
        self.cannot_restore: str | None = None  # why restore() put nothing back, if not age
        self._saved_objects: dict[str, Any] = {}
        self._waiting_for_model: dict[str, Any] = {}  # optimizers' shards, until their model
        self._saved_shards: dict[str, dict[str, Any]] = {}  # the resumed one's: file -> hash
        self._shards_checked = False  # ... all hashed already (one process wrote them)
        self._last_position: tuple[int, int, int] | None = None
        self.last_reason: str | None = None  # why the newest save was made (the profiler asks)
        self._sync_save_s: float | None = None
        self._writing = False  # a background write was started and its result not yet read
        self._proposed = False  # rank 0 asked the ranks for a save, not yet agreed
        self._shards_future: Any = None  # this rank's shards being written (dcp.async_save)
        self._shards_group: Any = None  # the gloo group DCP's background collectives use
        self._held = False  # a save was due on an epoch's last step: taken at the epoch's end
        # keep(label) asked in an epoch's end (early stopping's best, from run.log): made when
        # run.epochs moves on, once the whole epoch's end has run (label, step asked at)
        self._keep_at_epoch_end: tuple[str, int] | None = None
        self._pace = StepPace()  # the step time between the handler's sparse calls
        self.read_only = False  # torchrun ranks other than 0 restore but never write
        self.ranks = ranks_from_env()
        self.pinned: dict[str, str] = {}  # label -> checkpoint kept whatever `keep` says

    # resume -------------------------------------------------------------------------------
    def on_start(self, run: RunContext) -> None:
        run.checkpoints = self  # rollback and early stopping's best weights ask us
        self.ranks = ranks_from_env()
        self.read_only = not self.ranks.is_main
        self.storage = open_storage(self.settings.location(run.id, _default_location(run)))
        # every save goes through DCP, whose import takes 1-2 s in a cold process: paid here,
        # before the first step, not inside the first save, where it would count as the loop's
        # stall (every: auto spaced the next saves by it; a short stalled timeout fired on it)
        import torch.distributed.checkpoint.state_dict  # noqa: F401
        self.writer = CheckpointWriter(self.storage, self.settings.keep,
                                       asynchronous=self.settings.mode == "async")
        try:
            loaded = load_latest(self.storage)
        except Exception as exc:
            raise ConfigError(f"cannot read checkpoints at {self.storage.url!r}: {exc}") from None
        if not self.read_only:
            self.storage.check_writable()
        if loaded is None:
            return
        for name, why in loaded.skipped:
            self.writer.known_bad.add(name)
            run.record_event(EventKind.CHECKPOINT, "skipped", f"{name} {why}; trying an older one",
                             checkpoint=name)
        if not loaded.payload:
            self._no_usable_checkpoint(run, len(loaded.skipped))
            return
        self._saved_shards = loaded.shards
        self._shards_checked = loaded.shards_checked
        self._resume(run, loaded.name, loaded.payload)
        self.writer.pinned = set(self.pinned.values())

    def _no_usable_checkpoint(self, run: RunContext, count: int) -> None:
        message = (f"none of the {count} checkpoints in {self.storage.url} is usable "  # type: ignore[union-attr]
                   "(see the events above)")
        if self.settings.strict_resume:
            raise ConfigError(f"{message}; strict_resume is on, so the run does not start fresh. "
                              "Fix or remove them, or set checkpoint.strict_resume: false")
        print(f"prudent: warning: {message}; starting from scratch", file=sys.stderr)
        run.record_event(EventKind.CHECKPOINT, "fresh_start", message + "; starting from scratch")

    def _resume(self, run: RunContext, name: str, payload: dict[str, Any]) -> None:
        run.load_state_dict(payload["run"])
        restore_rank_state(run, payload["run"], self.ranks)
        # the position stays counted in the saved world until run.batches sees the loader
        check_world_change(run, run.state.world_size, self.ranks.world_size)
        self._saved_objects = dict(payload["objects"])
        self.resumed_from = name
        parts = payload["run"].get("ranks")
        self.resumed_hosts = [(p or {}).get("host", "?") for p in parts] if parts else None
        if not self.ranks.is_distributed:  # several ranks: told once every rank has started
            record_membership(run, self.resumed_hosts, [host_name()])
        state = run.state
        self._last_position = run.position
        self.schedule.saved(state.step)
        if state.num_epochs is None:  # a loop without epochs (run.steps): no epoch to name
            where = f"step {state.step}" + (f" of {state.num_steps}" if state.num_steps else "")
        else:
            where = (f"step {state.step}, epoch {state.epoch + 1}, {state.batches_in_epoch} "
                     "batches into it")
        run.record_event(EventKind.CHECKPOINT, "resumed", f"resumed from {name}: {where}",
                         checkpoint=name)
        if not self.quiet and self.ranks.is_main:  # where a relaunch picks up: once per job
            print(f"prudent | {run.id} | resumed from {name}: {where}",
                  file=self._stream or sys.stderr, flush=True)

    def on_attach(self, run: RunContext, objects: dict[str, Any]) -> None:
        sharded: dict[str, Any] = {}
        for key, obj in objects.items():
            check_saveable(key, obj)
            if key not in self._saved_objects:
                continue
            saved = self._saved_objects.pop(key)
            if is_sharded_entry(saved):
                sharded[key] = saved
            else:  # saved whole: into this object, whatever wraps or shards it now
                _restore_whole(run, key, obj, saved)
        sharded.update(self._waiting_for_model)
        self._waiting_for_model = {}
        pairs = module_pairs(run.objects)
        if not any(isinstance(obj, torch.nn.Module) for obj in run.objects.values()):
            # an optimizer attached before its model: its state is read with the model's
            self._waiting_for_model = {k: v for k, v in sharded.items() if k not in pairs}
            sharded = {k: v for k, v in sharded.items() if k in pairs}
        if sharded:
            self._restore_shards(run, sharded, pairs)

    def _restore_shards(self, run: RunContext, saved: dict[str, Any],
                        pairs: dict[str, Any]) -> None:
        """Every rank reads its shards back (a collective: every rank attaches alike), into
        sharded objects or whole ones (a job resumed on one process, or under DDP)."""
        missing = sorted(set(saved) - set(pairs))
        if missing:
            raise ConfigError(
                f"the checkpoint holds {', '.join(missing)} in shards, but the attached "
                f"{' and '.join(missing)} is not a model, or not the optimizer of an attached "
                "model: attach the model, then (or together with) its optimizer")
        assert self.storage is not None
        self._check_shards(run, shards_folder_of(saved))
        load_sharded({k: pairs[k] for k in saved}, saved, self.storage, _group_of(run))

    def _check_shards(self, run: RunContext, folder: str) -> None:
        """Every rank hashes its share of the shard files (and DCP's pickled index, which it
        is about to unpickle) against the manifest; all ranks refuse alike when one differs."""
        assert self.storage is not None
        if self._shards_checked:
            return
        if not self._saved_shards:
            raise ConfigError(f"{self.resumed_from}'s manifest lists no hashes of its shards in "
                              f"{folder}: prudent loads only shards it can check (DCP's index is "
                              "unpickled): remove that checkpoint to resume from the one before")
        bad = corrupted_shards(self.storage, folder, self._saved_shards, self.ranks.rank,
                               self.ranks.world_size if _ranks_agree(run) else 1)
        if _ranks_agree(run):
            bad = sorted({name for found in run.rank_group.all_gather(bad) for name in found})
        if bad:
            raise ConfigError(f"{self.resumed_from} is corrupted: {', '.join(bad)} differs from "
                              "the checksum in its manifest. Nothing was loaded: remove "
                              f"{self.resumed_from} (and {folder}) to resume from the one before")

    # save ---------------------------------------------------------------------------------
    def on_step_end(self, run: RunContext, metrics: dict[str, Any]) -> None:
        if self.writer is None:
            return
        busy = False  # most steps: no write in flight, nothing to ask the writer
        if self._writing:
            busy = self.writer.busy
            if not busy:
                self._writing = False
                self._report(run, self.writer.completed())
        if _ranks_agree(run):
            self._step_end_ranks(run, busy)
            return
        # auto never queues a save behind one in flight; fixed intervals are the user's call
        step = run.state.step
        if (self._held or self.schedule.due_at_step(step)) and run.stop_requested is None \
                and not (busy and self.schedule.kind == "auto"):
            if run.epoch_end_follows and not self._held:
                # Lightning restarts from a checkpoint of an epoch's last step with the next
                # epoch and without that epoch's validation, whose loader draws from the RNG:
                # the next epoch's order would differ. Taken at the epoch's end (after the
                # validation) instead; at the next step if no epoch end comes.
                self._held = True
                return
            self._held = False
            self.save(run, "periodic")
        if not self._writing:
            self._sleep(run, step)

    def _step_end_ranks(self, run: RunContext, busy: bool) -> None:
        """Under torchrun: every N steps, every rank knows the step and saves; a timed (or
        auto) schedule is rank 0's clock, so rank 0 proposes and every rank saves the step
        after (the ranks agree on it, see ``prudent.distributed.torchrun``). Never asleep: the
        agreement can come at any step."""
        if self.schedule.kind == "steps":
            if self.schedule.due_at_step(run.state.step):
                self.save(run, "periodic")
        elif run.save_agreed:
            self._proposed = False
            self.save(run, "periodic")
        elif not (self.read_only or self._proposed or run.stop_requested or
                  (busy and self.schedule.kind == "auto")) \
                and self.schedule.due_at_step(run.state.step):
            self._proposed = run.save_proposed = True

    def _sleep(self, run: RunContext, step: int) -> None:
        """No write to follow: skip the steps before the next save could be due (the kernel
        then compares one number a step instead of calling this handler)."""
        step_s = self._pace.seen(step, self.schedule.clock())
        waits = self.schedule.steps_to_wait(step, step_s)
        if waits:
            run.sleep_until(self, step + waits)

    def on_epoch_end(self, run: RunContext, epoch: int) -> None:
        if self.writer is None:
            return
        self._keep_asked_in_epoch_end(run)
        held, self._held = self._held, False
        due = held or self.schedule.due_at_epoch_end(epoch)
        if _ranks_agree(run):  # rank 0's timed schedule decides for every rank
            due = run.rank_group.from_main(due)
        if due and not self._at_saved_position(run):  # (a best kept at this epoch's end)
            self.save(run, "periodic" if held else "epoch_end")

    def on_stop_requested(self, run: RunContext, reason: StopReason) -> None:
        # a pruned trial is never resumed; non-finite weights are not worth resuming from
        worthless = reason.kind is StopKind.PRUNED or reason.rule == "non_finite"
        if self.writer is None or not self.settings.on_stop or worthless:
            return
        self._finish_write(run)
        if self._at_saved_position(run):
            return
        left = run.stop_deadline - time.time() if run.stop_deadline else None
        if left is not None and not _ranks_agree(run) and self._sync_save_s is not None and self._sync_save_s > left:
            run.record_event(EventKind.CHECKPOINT, "emergency_skipped",
                             f"a save takes about {self._sync_save_s:.1f} s but only {left:.1f} s "
                             f"of notice is left: keeping the newest periodic checkpoint instead")
            return
        self.save(run, f"stop:{reason}", synchronous=True)

    def on_end(self, run: RunContext, status: str, stop_reason: StopReason | None) -> None:
        self.wait_for_shards()  # before the process ends: its thread would die mid-write
        if self.writer is not None:
            self.writer.close()
            self._report(run, self.writer.completed())
        if self._saved_objects or self._waiting_for_model:
            missing = ", ".join(sorted({**self._saved_objects, **self._waiting_for_model}))
            run.record_event(EventKind.CHECKPOINT, "not_restored", f"the checkpoint holds {missing} but "
                             "the script never attached it: attach it with run.attach(...)")

    def save(self, run: RunContext, reason: str, synchronous: bool = False, *,
             every_rank: bool = True, at_boundary: bool = False) -> None:
        """Checkpoint the run now (a snapshot; written in the background unless synchronous).

        Under torchrun every rank calls it at the same step (``every_rank``): each hands its
        own part to rank 0, which writes. ``at_boundary``: asked between two steps (inside
        ``run.log``): the position and torch's generator are the last boundary's
        (``RunContext.boundary``), where a resumed loop starts again."""
        assert self.writer is not None
        state = run.state
        started = time.perf_counter()
        every_rank = every_rank and _ranks_agree(run)
        folder = checkpoint_name(state.step) + SHARDS_SUFFIX  # models' state, beside it
        # sharded state (FSDP2): every rank writes its own shards (and the replicated ones)
        sharded = self._sharded_to_save(run, every_rank)
        kept, shards_written = (self._save_shards(run, folder, state.step, synchronous)
                                if sharded else ({}, None))
        parts = run.rank_group.gather_to_main(rank_state(run)) if every_rank else None
        if self.read_only:
            if every_rank:  # took part: at the same position and schedule as rank 0
                self._last_position = run.position
                self.schedule.saved(state.step)
            return
        # the save still in flight ends first and its 'saved' is recorded now, before this
        # one is handed over: the rows this one exports before it commits include that event
        # (saves that chain, each written slower than the steps between them, would otherwise
        # report none until the writer is idle, and a new machine would miss them all)
        self._finish_write(run)
        tensors: dict[str, Any] | None = None  # replicated state: this writer writes it once
        if not sharded:
            tensors, kept = dcp_entries(module_pairs(run.objects, saving=True), folder)
        self._last_position = run.position
        # the training thread builds the payload: cheap for a module's state_dict (references)
        # and for an adapter's framework checkpoint (its object, serialised by the writer's
        # thread); the loop's stall, which the automatic schedule spaces saves by, counts it
        payload = {"objects": {k: kept[k] if k in kept else state_of(v, deferred=True)
                               for k, v in run.objects.items()},
                   "run": run.state_dict()}
        meta = {"run_id": run.id, "epoch": payload["run"]["state"]["epoch"],
                "batches_in_epoch": payload["run"]["state"]["batches_in_epoch"], "reason": reason}
        # the world it was taken in, one process too: an elastic job's membership changes
        # are told from it (prudent.distributed.elastic), and a resume on more ranks seeds the
        # others apart
        parts = parts or ([rank_state(run, rng=payload["run"]["rng"])]  # captured just above
                          + [None] * (self.ranks.world_size - 1))
        payload["run"]["ranks"] = parts
        meta["world"] = world_of([p or {"host": "?"} for p in parts])
        boundary = run.resume_boundary
        if at_boundary and boundary is not None:
            self._last_position = _as_at_boundary(boundary, payload, meta,
                                                  run.boundary_generators)
        for handoff in run.before_checkpoint:  # the rows of the steps it holds, to the writer
            handoff(run)
        prepared_s = time.perf_counter() - started
        self.schedule.saved(state.step)
        result = self.writer.save(state.step, payload, meta, synchronous=synchronous,
                                  prepared_s=prepared_s,
                                  before_commit=_rows_first(run, shards_written),
                                  shards=folder if sharded or tensors else None,
                                  tensors=tensors)
        if result is None:  # written in the background: its end is reported at a step's end,
            self._writing = True  # so a save made while asleep (at an epoch's end) wakes it
            run.sleep_until(self, state.step + 1)
        self.last_reason = reason
        run.emit(Event.CHECKPOINT_TAKEN, state.step)
        if result is not None:
            self._report(run, [result])

    def _sharded_to_save(self, run: RunContext, every_rank: bool) -> dict[str, Any]:
        """The attached objects saved through DCP (none: the usual path)."""
        sharded = sharded_objects(run.objects)
        if sharded and self.ranks.is_distributed and not every_rank:
            raise ConfigError("a sharded (FSDP2) model is saved by every rank together; a save "
                              "on one rank alone cannot hold it")
        return sharded

    def _save_shards(self, run: RunContext, folder: str, step: int,
                     synchronous: bool) -> tuple[dict[str, Any], Callable[[], None] | None]:
        """Start this rank's part of the shards of every model and optimizer (one write in
        flight per rank); returns what ``state.pt`` keeps and, for rank 0's writer, what to
        wait for before the manifest."""
        self.wait_for_shards()
        asynchronous = self.settings.mode == "async"
        group = _group_of(run)
        if asynchronous and group is not None:
            if self._shards_group is None:  # DCP's background collectives, apart from ours
                from prudent.distributed.torchrun import new_gloo_group

                self._shards_group = new_gloo_group()
            group = self._shards_group
        assert self.storage is not None
        kept, future = save_sharded(module_pairs(run.objects, saving=True), self.storage, folder,
                                    group, asynchronous=asynchronous)
        self._shards_future = future
        if future is None:
            return kept, None
        if synchronous:
            self.wait_for_shards()
            return kept, None
        return kept, future.result

    def wait_for_shards(self) -> None:
        """This rank's shards of the last save are written (or failed: rank 0's save then
        reports it, as its manifest is never written)."""
        future, self._shards_future = self._shards_future, None
        if future is not None:
            try:
                future.result()
            except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException included
                print(f"prudent: warning: this rank's checkpoint shards failed: {exc}",
                      file=sys.stderr)

    # what other components ask of the checkpoints (through run.checkpoints) ----------------
    def keep(self, run: RunContext, label: str) -> str | None:
        """Checkpoint now (unless a checkpoint of this very position exists) and keep it under
        ``label`` whatever ``keep`` says; the checkpoint kept under ``label`` before returns to
        the usual rotation. Returns the checkpoint's name (None when nothing is written here)."""
        if self.writer is None or self.read_only:
            return None
        if self.ranks.is_distributed and sharded_objects(run.objects):
            return None  # rank 0 alone cannot save shards (see checkpoint.sharded)
        name = checkpoint_name(run.state.step)
        self.pinned[label] = name  # before the save: the pin rides in the checkpoint itself
        self.writer.pinned = set(self.pinned.values())
        if run.epoch_drawn is not None:
            # in an epoch's end: what the loop does after this run.log (a scheduler stepped
            # after the evaluation) belongs in it, or a resume from it skips that; no step
            # comes before run.epochs moves on, so the name stays true
            self._keep_at_epoch_end = (label, run.state.step)
            return name
        boundary = run.resume_boundary  # where a loop resumed from here would start
        position = boundary[:3] if boundary is not None else run.position
        if self._last_position != position:
            self._kept(run, label, at_boundary=True)
        return name

    def _kept(self, run: RunContext, label: str, at_boundary: bool) -> None:
        agreed = self._last_position
        # asked on rank 0 alone (from run.log): the other ranks' generators are not in it
        # (resumed from, they keep the script's streams; see checkpoint.ranks)
        self.save(run, f"keep:{label}", every_rank=False, at_boundary=at_boundary)
        if self.ranks.is_distributed:  # rank 0's own save: the agreed position stays
            self._last_position = agreed

    def _keep_asked_in_epoch_end(self, run: RunContext) -> None:
        """The keep asked in the epoch's end that just ran, now (none if a step came since:
        the loop left run.epochs and trained on). One the epoch's end never finished (the
        script raised in it, or left run.epochs there) is dropped: it might lack what the
        loop does after its run.log."""
        asked, self._keep_at_epoch_end = self._keep_at_epoch_end, None
        if asked is not None and asked[1] == run.state.step and not self._at_saved_position(run):
            self._kept(run, asked[0], at_boundary=False)

    def restore(self, run: RunContext, *, before_step: int | None = None,
                name: str | None = None, not_before: int | None = None) -> tuple[str, int] | None:
        """Load into the attached objects (model, optimizer, scheduler, ...) the newest good
        checkpoint older than ``before_step`` (and not older than ``not_before``), or the one
        called ``name``; the counters go on. Returns its name and step, or None when there is
        none."""
        if self.writer is None or self.storage is None:
            return None
        self._finish_write(run)
        for candidate in self.storage.checkpoints():  # newest first
            step = step_of(candidate)
            if (name is not None and candidate != name) or step is None:
                continue
            if before_step is not None and step >= before_step:
                continue
            if not_before is not None and step < not_before:
                return None  # the rest are older still
            loaded = load_checkpoint(self.storage, candidate)
            if loaded is None:
                continue
            if any(holds_shards(obj) for obj in run.objects.values()):
                # every rank would have to read its shards at once, and the ranks do not
                # decide a rollback together: nothing put back rather than half of it
                self.cannot_restore = ("the model is sharded (FSDP2): its shards are only read "
                                       "back by every rank together, at a resume")
                return None
            saved = {k: v for k, v in loaded.payload["objects"].items() if k in run.objects}
            in_shards = {k: v for k, v in saved.items() if is_sharded_entry(v)}
            if in_shards and not self._read_shards_alone(run, loaded, in_shards):
                continue
            for key, value in saved.items():
                if key not in in_shards:
                    restore_object(run.objects[key], value)
            run.record_event(EventKind.CHECKPOINT, "restored", f"{', '.join(run.objects)} put "
                             f"back as they were at step {step} ({candidate}), at step "
                             f"{run.state.step}", checkpoint=candidate, checkpoint_step=step)
            return candidate, step
        return None

    def _read_shards_alone(self, run: RunContext, loaded: Any, saved: dict[str, Any]) -> bool:
        """This process reads a checkpoint's replicated state back without the other ranks
        (a rollback, early stopping's best); False when its files are not the manifest's."""
        assert self.storage is not None
        folder = shards_folder_of(saved)
        bad = [] if loaded.shards_checked else \
            corrupted_shards(self.storage, folder, loaded.shards, 0, 1) if loaded.shards else [folder]
        if bad:
            run.record_event(EventKind.CHECKPOINT, "skipped", f"{loaded.name} is corrupted: "
                             f"{', '.join(bad)} differs from its manifest; trying an older one",
                             checkpoint=loaded.name)
            return False
        pairs = module_pairs(run.objects)
        load_sharded({k: pairs[k] for k in saved if k in pairs}, saved, self.storage, None,
                     alone=True)
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"pinned": dict(self.pinned)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pinned = dict(state.get("pinned", {}))

    def _at_saved_position(self, run: RunContext) -> bool:
        return self._last_position == run.position

    def _finish_write(self, run: RunContext) -> None:
        """Wait for the save in flight (if any) and report every finished one."""
        assert self.writer is not None
        self.writer.wait()
        self._writing = False
        self._report(run, self.writer.completed())

    def _report(self, run: RunContext, results: list[SaveResult]) -> None:
        for result in results:
            if result.not_finite is not None:
                message = (f"checkpoint at step {result.step} not kept: {result.not_finite} holds "
                           "NaN or infinite values; the older checkpoints are kept")
                print(f"prudent: warning: {message}", file=sys.stderr)
                run.record_event(EventKind.CHECKPOINT, "not_finite", message, step=result.step,
                                 tensor=result.not_finite)
                continue
            if result.error is not None:
                message = (f"checkpoint at step {result.step} failed: {result.error}; the previous "
                           "checkpoint is kept")
                print(f"prudent: warning: {message}", file=sys.stderr)
                run.record_event(EventKind.CHECKPOINT, "save_failed", message, step=result.step)
                continue
            self._sync_save_s = result.stall_s + result.write_s  # what an emergency save would take
            run.record_event(EventKind.CHECKPOINT, "saved", f"{result.name}: {result.num_bytes / 1e6:.1f} MB, "
                             f"loop blocked {result.stall_s * 1000:.1f} ms, written in "
                             f"{result.write_s:.2f} s", step=result.step, path=result.path,
                             bytes=result.num_bytes, stall_s=result.stall_s, write_s=result.write_s,
                             deleted=result.deleted)
            explanation = self.schedule.measured(result.stall_s, result.write_s)
            if explanation:
                run.record_event(EventKind.CHECKPOINT, "interval", explanation,
                                 interval_s=self.schedule.interval_s, cost_s=self.schedule.cost_s,
                                 mtbi_s=self.schedule.mtbi_s)
            run.emit(Event.CHECKPOINT_SAVED, result.path)


def _default_location(run: RunContext) -> str:
    return default_location(run.id, run.run_dir)


ROWS_WAIT_S = 10.0  # at most, for the store to take the rows before a checkpoint commits


def _rows_first(run: RunContext, then: Callable[[], None] | None) -> Callable[[], None]:
    """Before the checkpoint commits (on its writer's thread): the store writer commits the
    rows handed to it so far, those of the checkpoint's steps among them; a run resumed from
    the checkpoint does not train those steps again, so rows that died with the process (a
    SIGKILL) would be lost for good. A store that does not answer within ROWS_WAIT_S does not
    hold the checkpoint back (its rows wait in memory, or in the record, as ever). Then the
    run's record in the bucket takes them (``run.before_commit``): a new machine finds them."""
    def before_commit() -> None:
        if then is not None:
            then()
        run.writer.flush(timeout_s=ROWS_WAIT_S)
        for export in run.before_commit:
            export(run)

    return before_commit


def _as_at_boundary(boundary: tuple[int, int, int, int, Any], payload: dict[str, Any],
                    meta: dict[str, Any],
                    generators: tuple[int, dict[str, Any]] | None = None) -> tuple[int, int, int]:
    """Make a checkpoint taken between two steps hold the last boundary's position and
    torch generator (what the loop drew since, an evaluation's batches, is drawn again when
    it resumes there), and Python's and NumPy's where they were read at that boundary
    (``generators``: step, states; see ``RunContext.evaluated``); returns the position."""
    step, epoch, batches, before, torch_kept = boundary
    torch_state = kept_torch_state(torch_kept)
    payload["run"]["state"].update(epoch=epoch, batches_in_epoch=batches,
                                   epoch_samples_before=before)
    at_boundary = {"torch": torch_state}
    if generators is not None and generators[0] == step:
        at_boundary.update(generators[1])
    payload["run"]["rng"].update(at_boundary)
    for part in payload["run"].get("ranks") or []:
        if part is not None:  # this rank's own (rank 0's: keep is asked there alone)
            part["rng"] = {**part["rng"], **at_boundary}
    meta.update(epoch=epoch, batches_in_epoch=batches)
    return step, epoch, batches


def _restore_whole(run: RunContext, key: str, obj: Any, saved: Any) -> None:
    """Put an object's state saved whole back, translated where the model's form changed."""
    import torch

    if isinstance(obj, torch.nn.Module) and needs_translation(obj, saved):
        restore_whole_module(key, obj, saved)
    elif (owner := sharded_owner(obj, run.objects)) is not None:
        restore_whole_optimizer(key, owner, obj, saved)
    elif isinstance(obj, torch.optim.Optimizer) and holds_shards(obj):
        raise ConfigError(f"{key} updates a sharded (FSDP2) model that is not attached yet: "
                          f"attach the model before (or together with) {key}")
    else:
        restore_object(obj, saved)


def _group_of(run: RunContext) -> Any:
    """prudent's own group over the ranks for DCP's collectives (None: the default group)."""
    return run.rank_group.group if _ranks_agree(run) else None


def _ranks_agree(run: RunContext) -> bool:
    """Under torchrun with torch.distributed initialised: saves are taken by every rank."""
    group = run.rank_group
    return group is not None and group.ready
