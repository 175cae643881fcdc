"""Which versions are served: the base paths polled, versions loaded, swapped and unloaded.

Like TF Serving's file-system source and availability-preserving policy: every poll lists the
numeric version folders of each model's base path, loads the versions its version policy wants
(newest first; a version is loaded, warmed up with its ``tf_serving_warmup_requests``, then made
available) and only once one of those is available unloads the versions it no longer wants. A
request takes its servable under a lock and keeps it until it is answered, so a version swap
drops no request.

A version that fails to load (say its files were still being copied when a poll saw its folder)
is retried as TF Serving retries it (``--max_num_load_retries``, ``--load_retry_interval_micros``):
up to ``max_num_load_retries`` more times, ``load_retry_interval`` seconds apart, staying LOADING
meanwhile; after the last failure it is END with the error, and is tried again (with its retries
afresh) only once its folder changes: a file added, removed, resized or rewritten (say the copy
that was still under way completes). Retries are scheduled, not slept through, so one bad version
never holds up the others; the versions already serving stay.

A base path that does not exist is a warning when the server starts (and when it goes away), and
the reason the model's status gives for having no version; the model is served as soon as a
version appears there.

``reconfigure`` serves a new model list, as TF Serving's ReloadConfig does (a config file read again,
or a HandleReloadConfigRequest): models added are loaded, models removed are unloaded, a changed
version policy takes effect, all in one load pass; then the version labels are set, and only then are the versions
no longer wanted unloaded (so a label moved off a version in the same change never names it while it goes). A label must
name an AVAILABLE version (TF Serving's FAILED_PRECONDITION otherwise, and the labels before stay),
except that with ``allow_labels_for_unavailable`` a new label, or one that keeps its version, may
name any version. The labels are checked after the load pass, so a version can be loaded and
labelled in one change, and a label on version 1 is accepted at start-up once version 1 has loaded
(TF Serving checks them before its loads finish and refuses such labels at start-up).
"""

from __future__ import annotations

import gc
import os
import threading
import time
import traceback

import grpc
import tensorflow as tf
from tensorflow_serving.apis import get_model_status_pb2

from serving import monitoring
from serving.errors import ServingError, invalid, not_found
from serving.http_front import release_freed_memory
from serving.saved_model_io import versions
from serving.servable import Servable

State = get_model_status_pb2.ModelVersionStatus.State


def folder_fingerprint(path: str) -> tuple:
    """What a version folder holds, cheaply: each file's relative path, size and modification time."""
    found = []
    try:
        for folder, _, files in tf.io.gfile.walk(path):
            for file in files:
                stat = tf.io.gfile.stat(os.path.join(folder, file))
                found.append((os.path.relpath(os.path.join(folder, file), path), stat.length, stat.mtime_nsec))
    except tf.errors.OpError:  # the folder went away meanwhile: that is a change too
        return ("gone",)
    return tuple(sorted(found))


class ModelRegistry:
    """The models of ``configs`` (``serving.server_config.ModelConfig``) and their loaded versions."""

    def __init__(self, configs, batching=None, method_name_check: bool = False, log=print,
                 max_num_load_retries: int = 5, load_retry_interval: float = 60.0,
                 allow_labels_for_unavailable: bool = False):
        self._batching, self._method_name_check, self._log = batching, method_name_check, log
        self.max_num_load_retries, self.load_retry_interval = max_num_load_retries, max(0.0, load_retry_interval)
        self.allow_labels_for_unavailable = allow_labels_for_unavailable
        self.configs = {}  # name -> ModelConfig
        self._retries = {}  # name -> {version: (failures so far, next try time)}
        self._gave_up = {}  # name -> {version: folder_fingerprint at the last try}
        self._lock = threading.Lock()
        self._passes = threading.RLock()  # one load pass or reconfiguration at a time
        self._available = {}  # name -> {version: Servable}
        self._states = {}  # name -> {version: (State, error message)}
        self._labels = {}  # name -> {label: version}, set by reconfigure
        self._missing = set()  # names whose base path did not exist at the last poll
        self._stop = threading.Event()
        self._thread = None
        self._set_models(configs)

    # ------------------------------------------------------------------ lifecycle
    def reconfigure(self, configs) -> None:
        """Serves the models of ``configs`` from now on (see the module doc): one load pass, then the labels.
        Raises ``ServingError`` (FAILED_PRECONDITION) for a label it refuses; the models are served regardless."""
        with self._passes:
            self._set_models(configs)
            self._poll(unload=False)
            try:
                self._set_labels(configs)
            finally:  # the versions no longer wanted go after the labels moved off them, not before
                self._poll()

    def _set_models(self, configs) -> None:
        """Adds and removes models (a model whose base path changed is removed and added again)."""
        wanted = {c.name: c for c in configs}
        for name, config in list(self.configs.items()):
            if name not in wanted or wanted[name].base_path != config.base_path:
                self._remove(name)
        for name in wanted:
            if name not in self.configs:
                for table in (self._retries, self._gave_up, self._available, self._states):
                    table[name] = {}
        self.configs = wanted

    def _remove(self, name: str) -> None:
        for version in list(self._available[name]):
            self._unload(name, version)
        with self._lock:
            for table in (self._retries, self._gave_up, self._available, self._states, self._labels):
                table.pop(name, None)
            self._missing.discard(name)
            self.configs = {n: c for n, c in self.configs.items() if n != name}
        self._log(f"model {name}: no longer in the config; unloaded")

    def _set_labels(self, configs) -> None:
        """Every config's ``version_labels``, all or none (TF Serving's rule, see the module doc)."""
        with self._lock:
            labels = {}
            for config in configs:
                for label, version in config.labels:
                    before = self._labels.get(config.name, {}).get(label)
                    may_wait = self.allow_labels_for_unavailable and before in (None, version)
                    if not may_wait and version not in self._available[config.name]:
                        raise ServingError(grpc.StatusCode.FAILED_PRECONDITION,
                                           f"Request to assign label to version {version} of model {config.name}, "
                                           "which is not currently available for inference")
                    labels.setdefault(config.name, {})[label] = version
            self._labels = labels

    def poll(self) -> None:
        """One pass over every base path: load wanted versions, then unload unwanted ones."""
        with self._passes:
            self._poll()

    def _poll(self, unload: bool = True) -> None:
        for name, config in self.configs.items():
            self._check_base_path(name, config.base_path)
            wanted = config.aspired(versions(config.base_path))
            for version in [v for v in self._retries[name] if v not in wanted]:  # gone from disk meanwhile
                del self._retries[name][version]
                self._set_state(name, version, State.END, "the version left the base path before it loaded")
            for version in [v for v in self._gave_up[name] if v not in wanted]:
                del self._gave_up[name][version]
            for version in sorted(wanted, reverse=True):
                state, path = self._states[name].get(version), os.path.join(config.base_path, str(version))
                if (state is None or (state[0] == State.END and not state[1]) or self._retry_due(name, version)
                        or self._changed_since_given_up(name, version, path)):
                    self._load(name, version, path)
            # Availability first: the old versions go once a wanted one serves (or none is on disk any more).
            if unload and (not wanted or any(v in self._available[name] for v in wanted)):
                for version in [v for v in list(self._available[name]) if v not in wanted]:
                    self._unload(name, version)

    def _check_base_path(self, name: str, base_path: str) -> None:
        """Warns once when a model's base path is missing (at start-up, or when it goes away)."""
        missing = not tf.io.gfile.isdir(base_path)
        if missing and name not in self._missing:
            self._log(f"WARNING: model {name}: base path {base_path} does not exist; the model has no version "
                      "until one is exported there")
        elif not missing and name in self._missing:
            self._log(f"model {name}: base path {base_path} now exists")
        with self._lock:
            if missing:
                self._missing.add(name)
            else:
                self._missing.discard(name)

    def _changed_since_given_up(self, name: str, version: int, path: str) -> bool:
        """True (and logged) when the folder of a version given up on no longer holds what failed to load."""
        if version not in self._gave_up[name] or self._gave_up[name][version] == folder_fingerprint(path):
            return False
        del self._gave_up[name][version]
        self._log(f"model {name} version {version}: its folder changed since its load failed; loading it again")
        return True

    def _load(self, name: str, version: int, path: str) -> None:
        self._set_state(name, version, State.LOADING)
        attempted = folder_fingerprint(path)  # taken before the attempt: a change during it is a change
        servable = None
        try:
            servable = Servable(name, version, path, self._batching, self._method_name_check)
            warmed = servable.warm_up()
        except Exception as err:  # noqa: BLE001 -- any failure is this version's status, the server stays up
            if servable is not None:  # loaded, failed its warm-up: its batch threads stop
                servable.close()
            monitoring.record_load(path, ok=False)
            self._failed(name, version, err, attempted)
            return
        self._retries[name].pop(version, None)
        monitoring.record_load(path, ok=True)
        with self._lock:
            self._available[name][version] = servable
            self._states[name][version] = (State.AVAILABLE, "")
        self._log(f"model {name} version {version}: available ({path}, {warmed} warm-up requests)")

    def _failed(self, name: str, version: int, err: Exception, attempted: tuple) -> None:
        """A failed load: LOADING with a retry scheduled, or END with the error once retries are spent."""
        failures = self._retries[name].get(version, (0, 0.0))[0] + 1
        attempt = f"attempt {failures} of {self.max_num_load_retries + 1}"
        if failures <= self.max_num_load_retries:
            self._retries[name][version] = (failures, time.monotonic() + self.load_retry_interval)
            self._log(f"model {name} version {version}: load failed ({attempt}): {type(err).__name__}: {err}; "
                      f"retrying in {self.load_retry_interval:g} s")
            self._set_state(name, version, State.LOADING)
            return
        self._retries[name].pop(version, None)
        self._gave_up[name][version] = attempted
        self._log(f"model {name} version {version}: load failed ({attempt}, giving up): {err}; it is loaded again "
                  f"if its folder changes\n"
                  f"{traceback.format_exc(limit=3)}")
        self._set_state(name, version, State.END, f"{type(err).__name__}: {err}")

    def _retry_due(self, name: str, version: int) -> bool:
        pending = self._retries[name].get(version)
        return pending is not None and time.monotonic() >= pending[1]

    def retries_pending(self) -> bool:
        """True while some version waits for another load attempt."""
        return any(self._retries[name] for name in self.configs)

    def _unload(self, name: str, version: int) -> None:
        with self._lock:
            servable = self._available[name].pop(version)
            self._states[name][version] = (State.UNLOADING, "")
        servable.close()
        del servable
        gc.collect()  # whatever cycles still hold it: its tables are destroyed with it (Servable.__del__)
        release_freed_memory(min_interval=0)  # and the allocator hands the freed pages back
        self._set_state(name, version, State.END)
        self._log(f"model {name} version {version}: unloaded")

    def _set_state(self, name: str, version: int, state, error: str = "") -> None:
        with self._lock:
            self._states[name][version] = (state, error)

    def start_polling(self, seconds: float) -> None:
        """Polls every ``seconds`` in a background thread (0: only until pending load retries are done)."""
        if seconds <= 0 and not self.retries_pending():
            return
        wait = seconds if seconds > 0 else min(1.0, self.load_retry_interval) or 0.05

        def loop():
            while not self._stop.wait(wait):
                if seconds <= 0 and not self.retries_pending():
                    return
                try:
                    self.poll()
                except Exception:  # noqa: BLE001 -- e.g. a base path on flaky storage; next poll retries
                    self._log(f"poll failed:\n{traceback.format_exc(limit=3)}")

        self._thread = threading.Thread(target=loop, name="model-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops polling and unloads everything."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for name in self.configs:
            for version in list(self._available[name]):
                self._unload(name, version)

    # ------------------------------------------------------------------ lookups
    def servable(self, name: str, version: int | None = None, label: str = "") -> Servable:
        """The servable a request's ModelSpec names (latest available version by default)."""
        with self._lock:
            if label:
                if label not in self._labels.get(name, {}):
                    raise invalid(f"Unrecognized servable version label: {label}")
                version = self._labels[name][label]
            loaded = self._available.get(name, {})
            if version is None:
                if not loaded:
                    raise not_found(f"Servable not found for request: Latest({name}){self._missing_reason(name)}")
                return loaded[max(loaded)]
            if version not in loaded:
                raise not_found(f"Servable not found for request: Specific({name}, {version})")
            return loaded[version]

    def _missing_reason(self, name: str) -> str:
        """``": its base path ... does not exist"`` for a model whose base path is missing (call under the lock)."""
        return f": its base path {self.configs[name].base_path} does not exist" if name in self._missing else ""

    def status(self, name: str, version: int | None = None) -> list:
        """``[(version, State, error message)]`` of a model, or of one of its versions."""
        with self._lock:
            states = dict(self._states.get(name, {}))
            reason = self._missing_reason(name)
        if version is not None:
            if version not in states:
                raise not_found(f"Could not find version {version} of model {name}")
            return [(version, *states[version])]
        if not states:
            raise not_found(f"Could not find any versions of model {name}{reason}")
        return [(v, *states[v]) for v in sorted(states)]
