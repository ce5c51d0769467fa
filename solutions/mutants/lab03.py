"""Plausible wrong answers to lab 03's judged exercises: each must fail its check.

Every mutant is the solution with some replacements in one answer cell: ``{exercise:
{name: (cell id, [(old, new), ...])}}``. An ``old`` text that is no longer in the
solution makes the mutant matrix fail, so the mutants follow the solution when it
changes. ``ddtk course check --mutants`` (and ``tests/test_judging.py``) prove that the
stub fails, the solution passes and every mutant fails, with the message saying why.
"""

CAPTURE, SAVE, TRAIN, CONSISTENCY = "9d288f91", "3a6f6f6b", "aedc4add", "11371148"
SHARD, RECOVERY, ELASTIC = "3dbab0ba", "dc36b336", "5b9bab2f"
NOTICE = "b7c1e4d2"

MUTANTS = {
    1: {
        "the RNG is not part of the state": (
            CAPTURE,
            [
                ('        "rng": torch.get_rng_state(),\n', ""),
                ('    torch.set_rng_state(state["rng"])\n', ""),
            ],
        ),
        "the snapshot aliases the live tensors": (
            CAPTURE,
            [
                ('"model": snapshot(model.state_dict())', '"model": model.state_dict()'),
                (
                    '"optimizer": snapshot(optimizer.state_dict())',
                    '"optimizer": optimizer.state_dict()',
                ),
            ],
        ),
        "the optimizer's momentum is not restored": (
            CAPTURE,
            [
                ('    optimizer.load_state_dict(state["optimizer"])\n', ""),
            ],
        ),
        "restore recomputes from scratch instead of loading": (
            CAPTURE,
            [
                (
                    '    model.load_state_dict(state["model"])\n    optimizer.load_state_dict(state["optimizer"])\n'
                    '    torch.set_rng_state(state["rng"])\n',
                    "    torch.manual_seed(seed)\n    redo, redo_opt = make_model(seed)\n"
                    '    train_steps(redo, redo_opt, 0, state["step"])\n'
                    "    model.load_state_dict(redo.state_dict())\n    optimizer.load_state_dict(redo_opt.state_dict())\n",
                ),
            ],
        ),
    },
    2: {
        "written in place: no temporary file, fsync or rename": (
            SAVE,
            [
                (
                    '    tmp = data.with_name(data.name + ".tmp")\n    with open(tmp, "wb") as f:\n'
                    "        torch.save(state, f)\n        f.flush()\n        os.fsync(f.fileno())\n"
                    "    os.replace(tmp, data)\n",
                    '    with open(data, "wb") as f:\n        torch.save(state, f)\n',
                ),
                (
                    '    tmp = final.with_name(final.name + ".tmp")\n    with open(tmp, "w") as f:\n'
                    "        json.dump(manifest, f)\n        f.flush()\n        os.fsync(f.fileno())\n"
                    "    os.replace(tmp, final)\n",
                    '    with open(final, "w") as f:\n        json.dump(manifest, f)\n',
                ),
            ],
        ),
        "renamed without an fsync": (
            SAVE,
            [
                (
                    "        torch.save(state, f)\n        f.flush()\n        os.fsync(f.fileno())\n",
                    "        torch.save(state, f)\n",
                ),
            ],
        ),
        "the directory is never fsynced": (SAVE, [("    fsync_dir(run_dir)\n", "")]),
        "the loader trusts the manifest without hashing": (
            SAVE,
            [
                ('or hashlib.sha256(payload).hexdigest() != manifest["sha256"]', "or False"),
            ],
        ),
        "the loader takes the newest data file, manifest or not": (
            SAVE,
            [
                (
                    '    for manifest_path in sorted(run_dir.glob("step-*.json"), reverse=True):\n',
                    '    for data_path in sorted(run_dir.glob("step-*.pt"), reverse=True):\n'
                    "        import io\n"
                    "        try:\n"
                    '            return int(data_path.stem.split("-")[1]), torch.load(io.BytesIO(data_path.read_bytes()), weights_only=False)\n'
                    "        except Exception:\n"
                    "            continue\n"
                    "    for manifest_path in []:\n",
                ),
            ],
        ),
    },
    3: {
        "saves checkpoints but never loads one": (
            TRAIN,
            [
                ("    found = load_latest(run_dir)\n", "    found = None\n"),
            ],
        ),
        "loads the weights but restarts the step count": (
            TRAIN,
            [
                (
                    "        step = restore_state(found[1], model, optimizer)\n",
                    "        restore_state(found[1], model, optimizer)\n        step = 0\n",
                ),
            ],
        ),
        "reseeds the RNG after the restore": (
            TRAIN,
            [
                (
                    "        step = restore_state(found[1], model, optimizer)\n",
                    "        step = restore_state(found[1], model, optimizer)\n        torch.manual_seed(seed)\n",
                ),
            ],
        ),
    },
    4: {
        "no handler: SIGTERM's default action ends the process": (NOTICE, [
            ("    previous = {sig: signal.signal(sig, on_notice) for sig in (signal.SIGTERM, signal.SIGUSR1)}\n",
             "    previous = {}\n"),
        ]),
        "the handler exits at once (sys.exit in the handler)": (NOTICE, [
            ("        notice.append(signum)\n", "        raise SystemExit(0)\n"),
        ]),
        "SIGTERM only: Slurm's SIGUSR1 still kills it": (NOTICE, [
            ("for sig in (signal.SIGTERM, signal.SIGUSR1)}", "for sig in (signal.SIGTERM,)}"),
        ]),
        "stops at the notice without committing": (NOTICE, [
            ("        if notice and step != committed:  # the step boundary after the notice\n"
             "            atomic_save(capture_state(model, optimizer, step), run_dir, step)\n", ""),
        ]),
        "waits for the next periodic checkpoint": (NOTICE, [
            ("        while step < steps and not notice:\n",
             "        while step < steps and not (notice and step % save_every == 0):\n"),
        ]),
        "the checkpoint is numbered one step ahead": (NOTICE, [
            ("        if notice and step != committed:  # the step boundary after the notice\n"
             "            atomic_save(capture_state(model, optimizer, step), run_dir, step)\n",
             "        if notice and step != committed:  # the step boundary after the notice\n"
             "            atomic_save(capture_state(model, optimizer, step + 1), run_dir, step + 1)\n"),
        ]),
    },
    5: {
        "a strided share instead of a contiguous one": (SHARD, [
            ("    return global_ids(step)[rank * share : (rank + 1) * share]\n",
             "    return global_ids(step)[rank::world]\n"),
        ]),
        "no error for a world that does not divide the batch": (SHARD, [
            ("    if GLOBAL_BATCH % world:\n", "    if False:\n"),
        ]),
        "the same samples at every step": (SHARD, [
            ("    return global_ids(step)[rank * share", "    return global_ids(0)[rank * share"),
        ]),
    },
    6: {
        "never resumes from ray.train.get_checkpoint()": (
            ELASTIC,
            [
                ("    checkpoint = ray.train.get_checkpoint()\n", "    checkpoint = None\n"),
            ],
        ),
        "restores the weights and the step, not the optimizer": (
            ELASTIC,
            [
                (
                    "            step = restore_state(\n"
                    '                torch.load(Path(d) / "state.pt", weights_only=False), model, optimizer\n'
                    "            )\n",
                    '            state = torch.load(Path(d) / "state.pt", weights_only=False)\n'
                    '            model.load_state_dict(state["model"])\n'
                    '            step = state["step"]\n',
                ),
            ],
        ),
        "every rank trains on rank 0's share": (
            ELASTIC,
            [
                (
                    "        ids = shard(step, rank, world)\n",
                    "        ids = shard(step, 0, world)\n",
                ),
            ],
        ),
        "reports at every step": (
            ELASTIC,
            [
                (
                    '        if step % config["checkpoint_every"] == 0 or step >= stop_step(config):\n',
                    "        if True:\n",
                ),
            ],
        ),
        "every rank attaches a checkpoint": (
            ELASTIC,
            [
                ("                if rank == 0:\n", "                if True:\n"),
            ],
        ),
        "a fixed number of workers": (
            ELASTIC,
            [
                (
                    '            num_workers=(1, config["max_workers"]),\n',
                    '            num_workers=config["max_workers"],\n',
                ),
            ],
        ),
        "no RunEvents callback": (
            ELASTIC,
            [
                ('            callbacks=[RunEvents(config["log_dir"])],\n', ""),
            ],
        ),
    },
    7: {
        "steps lost without the step in flight": (RECOVERY, [
            ('"steps_lost": last["step"] + 1 - start["resumed_from"]',
             '"steps_lost": last["step"] - start["resumed_from"]'),
        ]),
        "the last step before the fault, not before the restart": (RECOVERY, [
            ('began <= e["t"] < start["t"]', 'began <= e["t"] < t_fault'),
        ]),
        "restart and recovery swapped": (RECOVERY, [
            ('"restart_s": start["t"] - t_fault,\n        "recovery_s": first["t"] - t_fault,',
             '"restart_s": first["t"] - t_fault,\n        "recovery_s": start["t"] - t_fault,'),
        ]),
    },
    8: {
        "answers for the one log it was shown": (
            CONSISTENCY,
            [
                (
                    "    violations, committed = [], 0\n",
                    "    return []\n    violations, committed = [], 0\n",
                ),
                ("    seen, dups = set(), []\n", "    return []\n    seen, dups = set(), []\n"),
                ("    fps: dict[int, set] = {}\n", "    return []\n    fps: dict[int, set] = {}\n"),
            ],
        ),
        "a restart from the last commit counted as lost": (
            CONSISTENCY,
            [
                ('e["resumed_from"] < committed', 'e["resumed_from"] <= committed'),
            ],
        ),
        "duplicates counted across epochs": (
            CONSISTENCY,
            [
                ('        epoch = e["step"] // STEPS_PER_EPOCH\n', "        epoch = 0\n"),
            ],
        ),
        "every execution of a step, not the effective history": (
            CONSISTENCY,
            [
                (
                    "    for e in effective_history(events):\n        fps.setdefault",
                    '    for e in [e for e in events if e["kind"] == "step"]:\n        fps.setdefault',
                ),
            ],
        ),
        "the world size of a step's first execution": (
            CONSISTENCY,
            [
                (
                    '    for e in effective_history(events):\n        worlds[e["step"]] = e["world"]\n',
                    '    for e in reversed([e for e in events if e["kind"] == "step"]):\n'
                    '        worlds[e["step"]] = e["world"]\n',
                ),
            ],
        ),
    },
}
