"""The guard mutants: each breaks one safety guard on purpose, and the tests named with it must
notice. Run by guard_mutants.py.

A guard is found by its marker, a comment line `# guard: <id>` right above the guarded line, in
whichever file the code lives now: code moves freely, and the table does not name files. The
mutant replaces `original` with `replacement` in the guarded lines (the line below the marker and,
for an `original` of several lines, as many as it spans; other markers' lines do not count), where
`original` must occur exactly once. So a guard moved keeps its mutant, and a guard edited (its
`original` no longer there) stops the check with the mutant's id instead of testing something else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    id: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    why: str
    # Set, with the reason, for a mutant no reasonable test can kill: it is run and reported
    # every time, but does not fail the check (and fails it once a test does kill it, so the
    # mark is removed).
    known_survivor: str = ""


RET_E2E = "tests/workflows/test_retention.py"
SCRATCH = "tests/tierpoint/storage/test_scratch.py::"
CODED_VIEWS = (
    "tests/api/test_coded_views.py::"
    "test_the_views_show_a_coded_tiers_code_coverage_and_the_bytes_it_holds"
)
CODED_REPORT = (
    "tests/faults/test_coded_stripe_report.py::"
    "test_a_stripe_the_restore_found_corrupt_is_reported_and_confirmed_on_its_holder"
)
CODED_LOAD = "tests/client/torch/test_dcp_coded.py::"
CODED_SCRUB = (
    "tests/faults/test_coded_scrub.py::"
    "test_the_scrub_reads_each_stripe_on_its_holder_and_fails_a_set_below_k"
)
TIMELINE_ROLLBACK = "tests/api/test_rollback.py"
TIMELINE_FORKS = "tests/api/test_lineage_forks.py"
PEER_E2E = "tests/workflows/test_peer_tier.py::test_peer_copies_restore_a_lost_nodes_shards"
PEER_ENDPOINT = (
    "tests/workflows/test_peer_tier.py::"
    "test_the_data_endpoint_serves_only_registered_verified_files_to_credentials_and_expires"
)
RECHECK = "tests/workflows/test_retention_recheck.py"
FORK_SAFETY = "tests/client/test_fork_safety.py::"
TRIGGER = "tests/workflows/test_lifecycle_requests_retention.py"
PLANNER_TESTS = (
    "tests/tierpoint/retention/test_planner_examples.py",
    "tests/tierpoint/retention/test_planner_properties.py",
)
PATH_TESTS = (
    "tests/tierpoint/storage/test_paths.py",
    "tests/tierpoint/storage/test_confinement.py",
    "tests/tierpoint/storage/test_posix.py",
)
WRONG_CRC = (
    "tests/workflows/test_checkpoint_lifecycle.py::test_shard_with_wrong_checksum_is_never_promoted"
)
ROTTING = "tests/activities/test_copy.py::test_source_rotting_after_seal_is_caught_by_the_copy"
REBUILD_PLANNER = "tests/tierpoint/retention/test_planner_rebuild.py"
REBUILD_CATALOG = "tests/tierpoint/catalog/holds/test_rebuild.py"
AUTH = "tests/api/test_auth.py"
DELETES = "tests/tierpoint/storage/test_deletes.py"
CONFINEMENT = "tests/tierpoint/storage/test_confinement.py"
EXPIRY_E2E = (
    "tests/workflows/test_expiry_keeps_unregistered.py::"
    "test_expiry_deletes_the_registered_shards_and_nothing_else"
)
SYMLINK_SEAL = (
    "tests/workflows/test_expiry_keeps_unregistered.py::"
    "test_a_symlink_to_another_jobs_shard_is_refused_at_seal"
)
REWRITE_E2E = (
    "tests/workflows/test_delete_then_rewrite.py::"
    "test_a_step_written_again_while_it_is_deleted_keeps_its_new_bytes"
)
REWRITE_PEER = (
    "tests/workflows/test_delete_then_rewrite.py::"
    "test_with_two_peer_copies_on_three_nodes_the_new_bytes_are_kept_too"
)
READ_BACK_IDENTITY = (
    "tests/workflows/test_delete_then_rewrite.py::"
    "test_a_replica_recorded_before_identities_gets_its_own_when_read_back"
)
LATE_DELETE = "tests/workflows/test_late_delete_attempt.py"
DEV_KILLED = (
    "tests/apps/devstack/test_dev_killed.py::"
    "test_sigkill_leaves_no_server_and_a_restart_stops_the_postgres_it_left"
)
DEV_REFUSED = (
    "tests/apps/devstack/test_dev_killed.py::"
    "test_a_second_stack_on_a_live_stacks_data_dir_refuses_naming_it"
)

MUTANTS: tuple[Mutant, ...] = (
    # ---- executing retention: the re-check under row locks -----------------------------------
    Mutant(
        "recheck-kept-now",
        """    if expiry is None:
        why = ", ".join(keep.reasons) if keep is not None else "not planned any more"
        return BeginResult(state=BeginState.SKIPPED, reason=f"kept now: {why}")
""",
        """    if expiry is None:
        from tierpoint.retention.models import Expiry, ExpiryRule

        expiry = Expiry(
            checkpoint_id=checkpoint_id,
            step=0,
            tier=tier,
            bytes=0,
            rule=ExpiryRule.NOT_KEPT,
            reason="mutant: planned earlier",
        )
""",
        (
            RECHECK,
            "tests/tierpoint/catalog/tier_copy/test_expiry.py::"
            "test_an_expiry_is_planned_begun_under_a_fresh_plan_and_finished",
        ),
        "a pin or lease taken after planning must cancel the expiry",
    ),
    Mutant(
        "recheck-row-lock",
        "checkpoint_lock=RowLock.UPDATE,",
        "checkpoint_lock=None,",
        (
            RECHECK,
            "tests/tierpoint/catalog/tier_copy/test_expiry.py::"
            "test_a_pin_committed_while_a_round_waits_keeps_its_copy_and_the_rest_begin",
        ),
        "the re-check must wait for a pin or lease insert in flight on the checkpoint row",
    ),
    Mutant(
        "node-lost-tells-lifecycles-placing-peer-copies",
        "    placing = placing_peer_copies(session, peer_tiers)\n",
        "    placing: list[tuple[int, str, int]] = []\n",
        (
            "tests/faults/test_holder_lost_in_flight.py::"
            "test_a_holder_lost_before_its_copy_began_is_replaced",
        ),
        "a holder lost before its planned copy began must be told to the lifecycle and the copy "
        "made again",
    ),
    Mutant(
        "rereplication-waits-for-the-lifecycle",
        "            if placing and activity.info().attempt < PLACING_ATTEMPTS:\n",
        "            if False:\n",
        (
            "tests/faults/test_holder_lost_in_flight.py::"
            "test_a_copy_made_again_waits_for_the_lifecycle_to_place_the_others",
        ),
        "a copy made again while the lifecycle places the others must not land beside one",
    ),
    Mutant(
        "data-endpoint-condemns-by-the-catalog-of-now",
        "        listings.forget(tier, ref.job, ref.step)\n",
        "",
        (
            "tests/tierpoint/test_data_endpoint_step_again.py::"
            "test_a_step_registered_again_is_served_with_its_new_size",
        ),
        "a listing kept from before a step was registered again must not condemn its new copy",
    ),
    Mutant(
        "seal-records-no-identity-of-a-wrong-file",
        "ReplicaWrite(sh.id, ReplicaState.CORRUPT, location, self.node, 0, problem, None)",
        "ReplicaWrite(sh.id, ReplicaState.CORRUPT, location, self.node, 0, problem, v.identity)",
        (
            "tests/workflows/test_delete_after_a_failed_seal.py::"
            "test_a_delete_after_a_failed_seal_keeps_the_files_the_job_wrote_since",
            "tests/activities/test_seal.py::"
            "test_a_seal_verifies_the_registered_bytes_and_refuses_others",
        ),
        "a file the seal found not as registered (the job's, written again) is never deleted as "
        "if the catalog had verified it",
    ),
    Mutant(
        "deleted-run-gives-way",
        "            id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,\n",
        "            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,\n",
        (
            "tests/api/test_delete_in_flight.py::"
            "test_a_step_deleted_in_flight_and_registered_again_gets_a_lifecycle_of_its_own",
        ),
        "a step registered again must not join the deleted checkpoint's run still under its id",
    ),
    Mutant(
        "actions-lock-checkpoint-no-key-update",
        "ACTION_LOCK = RowLock.NO_KEY_UPDATE\n",
        "ACTION_LOCK = RowLock.UPDATE\n",
        (
            "tests/api/test_marker_lock_order.py::"
            "test_an_action_on_a_copy_being_promoted_waits_for_the_promotion_and_answers",
        ),
        "an action waiting for a tier copy a promotion holds must not block the promotion's "
        "event insert (a deadlock, answered 503)",
    ),
    # ---- the lifecycle asks for retention after each promotion -------------------------------
    Mutant(
        "request-activity-noop",
        "        await request_retention(self._need_client(), inp.job, inp.reason)\n",
        "        return None\n",
        (TRIGGER,),
        "a promotion must start the job's retention run (nothing else may be needed)",
    ),
    Mutant(
        "expiry-replans-failed-peer-copies",
        "        if remake is not None:\n",
        "        if remake is not None and False:\n",
        (
            "tests/workflows/test_peer_retention.py::"
            "test_a_peer_copy_failed_for_want_of_a_node_is_made_when_an_expiry_frees_one",
        ),
        "a peer copy failed for want of a free node must be made again once an expiry frees one",
    ),
    Mutant(
        "retention-coded-copy-needs-k-stripes",
        "        if n >= ks.get((cp, tier), n + 1):\n",
        "        if True:\n",
        (
            "tests/tierpoint/catalog/policy/test_stripe_totals.py::"
            "test_a_coded_copy_counts_as_verified_while_every_shard_keeps_k_stripes",
        ),
        "a coded copy with a shard below k stripes must not count as an intact copy to retention",
    ),
    Mutant(
        "lifecycle-no-request",
        """            if self._local_steps or workflow.patched(RETENTION_PATCH):
                await self._request_retention(plan, tier)
""",
        """            if self._local_steps or workflow.patched(RETENTION_PATCH):
                pass
""",
        (TRIGGER,),
        "the lifecycle workflow must request retention after a promotion",
    ),
    # ---- promote: restorable only when every shard is verified -------------------------------
    Mutant(
        "promote-count",
        "    if verified == total and stage_error is None:\n",
        "    if stage_error is None:\n",
        (WRONG_CRC, ROTTING),
        "a tier with an unverified shard must not become restorable",
    ),
    Mutant(
        "promote-verified-filter",
        """            Replica.tier == tier,
            Replica.state == ReplicaState.VERIFIED.value,
            not_on_lost_node(),
        )
    )
    assert total is not None and verified is not None""",
        """            Replica.tier == tier,
        )
    )
    assert total is not None and verified is not None""",
        (WRONG_CRC, ROTTING),
        "only verified replicas count towards promotion",
    ),
    Mutant(
        "promote-lost-node",
        "            Replica.state == ReplicaState.VERIFIED.value,\n"
        "            not_on_lost_node(),\n",
        "            Replica.state == ReplicaState.VERIFIED.value,\n",
        ("tests/tierpoint/catalog/tier_copy/test_promotion.py",),
        "a verified copy on a node declared lost does not count towards promotion",
    ),
    Mutant(
        "report-in-keeps-lost",
        """                "data_url": stmt.excluded.data_url,
            },
""",
        """                "data_url": stmt.excluded.data_url,
                "lost_at": None,
            },
""",
        ("tests/tierpoint/catalog/node/test_registry.py",),
        "a node declared lost stays lost when its worker (or a worker of many nodes) reports in",
    ),
    Mutant(
        "lost-among-share-lock",
        "node_lock=RowLock.SHARE",
        "node_lock=None",
        ("tests/tierpoint/catalog/node/test_registry.py",),
        "a node cannot be declared lost between a seal's read of it and the seal's write",
    ),
    Mutant(
        "replica-first-written-lost",
        "        if w.node_id is not None and w.node_id in lost\n",
        "        if False\n",
        ("tests/tierpoint/catalog/replica/test_machine.py",),
        "a seal that began before its node was declared lost cannot insert verified replicas",
    ),
    # ---- planner protections -----------------------------------------------------------------
    Mutant(
        "planner-pinned",
        "        why.append(KeepReason.PINNED)\n",
        "        pass\n",
        PLANNER_TESTS,
        "a pinned checkpoint never expires",
    ),
    Mutant(
        "planner-leased",
        "        why.append(KeepReason.LEASED)\n",
        "        pass\n",
        PLANNER_TESTS,
        "a leased checkpoint never expires",
    ),
    Mutant(
        "planner-quarantined",
        "        why.append(KeepReason.QUARANTINED)\n",
        "        pass\n",
        PLANNER_TESTS,
        "a quarantined copy is left for the operator",
    ),
    Mutant(
        "planner-latest-durable",
        "        why.append(KeepReason.LATEST_DURABLE)\n",
        "        pass\n",
        PLANNER_TESTS,
        "the latest restorable checkpoint on the most durable tier stays",
    ),
    Mutant(
        "planner-in-flight",
        "        why.append(KeepReason.IN_FLIGHT)\n",
        "        pass\n",
        PLANNER_TESTS,
        "the source of a copy in flight stays",
    ),
    Mutant(
        "planner-awaiting-durable",
        "        why.append(KeepReason.AWAITING_DURABLE)\n",
        "        pass\n",
        PLANNER_TESTS,
        "a local copy stays until the durable tier it is meant for has it",
    ),
    Mutant(
        "planner-no-good-copy",
        "        why.append(KeepReason.NO_GOOD_COPY)\n",
        "        pass\n",
        PLANNER_TESTS,
        "remnants of a kept checkpoint without any good copy stay",
    ),
    Mutant(
        "planner-last-copy",
        """                expire.pop(last, None)
                reasons[last] = [KeepReason.LAST_COPY, *reasons.get(last, ())]
""",
        "                pass\n",
        PLANNER_TESTS,
        "a kept checkpoint never loses its last good copy to keep rules",
    ),
    Mutant(
        "planner-last-copy-quota",
        """                held.insert(0, KeepReason.LAST_COPY)
                continue
""",
        "                pass\n",
        PLANNER_TESTS,
        "a quota never takes the last good copy of a checkpoint another tier keeps",
    ),
    # ---- path confinement --------------------------------------------------------------------
    Mutant(
        "paths-dotdot",
        '        if part in (".", ".."):\n',
        '        if part == ".":\n',
        PATH_TESTS,
        "a '..' component is refused",
    ),
    Mutant(
        "paths-absolute",
        '    if path.startswith("/"):\n',
        "    if False:\n",
        PATH_TESTS,
        "an absolute shard path is refused",
    ),
    Mutant(
        "posix-paths-refuse-symlinks",
        "_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS\n",
        "_RESOLVE = RESOLVE_BENEATH\n",
        (CONFINEMENT, SYMLINK_SEAL),
        "openat2 refuses every symlink below the tier root: RESOLVE_BENEATH from the root alone "
        "lets a symlink into another job's directory through",
    ),
    Mutant(
        "posix-walk-nofollow",
        "nxt = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)",
        "nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)",
        (CONFINEMENT,),
        "where the kernel has no openat2, the walk opens each directory with O_NOFOLLOW",
    ),
    Mutant(
        "posix-entry-nofollow",
        "os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)",
        "os.open(name, flags | os.O_CLOEXEC, mode, dir_fd=dir_fd)",
        (CONFINEMENT, SYMLINK_SEAL),
        "a symlink at a shard's name (or at the temp name a copy writes) is not followed",
    ),
    # ---- deleting: only what we registered ---------------------------------------------------
    Mutant(
        "expiry-deletes-only-registered",
        "            for parts, named in by_dir.items():\n",
        "            import shutil\n\n"
        "            shutil.rmtree(os.path.join(self.root, *base), ignore_errors=True)\n"
        "            for parts, named in by_dir.items():\n",
        (DELETES, EXPIRY_E2E),
        "expiry deletes the registered shards and our temp files, never the step directory's "
        "other contents",
    ),
    Mutant(
        "s3-deletes-only-registered",
        "        keys = [self.key(ShardRef(job, step, p, branch)) for p in paths]\n",
        "        listed = self.client.list_objects_v2(\n"
        "            Bucket=self.bucket, Prefix=self.checkpoint_prefix(job, step, (), branch)\n"
        "        )\n"
        '        keys = [o["Key"] for o in listed.get("Contents", [])]\n',
        (DELETES, EXPIRY_E2E),
        "an S3 expiry deletes the registered keys, never what a listing of the prefix holds",
    ),
    # ---- deleting: only the bytes the catalog verified ---------------------------------------
    Mutant(
        "delete-checks-identity",
        "    if stat.S_ISREG(st.st_mode) and is_recorded(dir_fd, aside, st):\n",
        "    if stat.S_ISREG(st.st_mode):\n",
        (DELETES, REWRITE_E2E, REWRITE_PEER),
        "a delete removes a shard's file only if it is the one the catalog verified: a file the "
        "job wrote at the path since (the step written again) is kept",
    ),
    Mutant(
        "delete-puts-back-without-replacing",
        "        renameat_noreplace(dir_fd, aside, name)\n        return True\n",
        "        os.rename(aside, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)\n"
        "        return True\n",
        (f"{DELETES}::test_what_an_interrupted_delete_left_aside_is_settled_by_the_next",),
        "a file a delete moved aside and must keep goes back only where nothing appeared "
        "meanwhile: it never replaces a newer file at the shard's path",
    ),
    Mutant(
        "seal-records-identity",
        "                    identity=v.identity,\n",
        "                    identity=None,\n",
        (REWRITE_E2E,),
        "the seal records which file it verified, so a delete tells a file written again with "
        "the same bytes from it",
    ),
    Mutant(
        "read-back-records-identity",
        "            scrub.record_identities(s, self.identities)\n",
        "",
        (READ_BACK_IDENTITY,),
        "a scrub or verify records the identity of the file it read good, so replicas recorded "
        "before identities get one",
    ),
    Mutant(
        "delete-holds-the-copys-lock",
        "    session.execute(select(func.pg_advisory_xact_lock_shared(_delete_lock(checkpoint_id, "
        "tier))))\n",
        "",
        (LATE_DELETE,),
        "a delete holds its copy's lock until its last request, so a late attempt lands before "
        "the step can be registered and written again (an S3 object has no identity to check)",
    ),
    Mutant(
        "finish-waits-for-deletes",
        "    session.execute(select(func.pg_advisory_xact_lock(_delete_lock(checkpoint_id, "
        "tier))))\n",
        "",
        (LATE_DELETE,),
        "a copy becomes expired (and its step registrable again) only once no delete of it runs",
    ),
    Mutant(
        "reconcile-removes-only-our-temp-files",
        "        if not is_partial_name(name) or not sub[1:]:\n",
        "        if not sub[1:]:\n",
        (DELETES,),
        "reconciliation's repair removes only files named like our temp files",
    ),
    Mutant(
        "paths-file-above-file",
        "            if path[:cut] in every:\n",
        "            if False:\n",
        (
            "tests/client/test_paths.py",
            "tests/client/test_manifest.py",
            "tests/api/test_bad_input.py::test_bad_manifest_is_refused_and_writes_nothing",
        ),
        "a manifest naming a file above another ('a' and 'a/b') is refused on both sides",
    ),
    # ---- erasure-coded stripes ---------------------------------------------------------------
    Mutant(
        "erasure-stripe-crc",
        "        if crc32c_hex(crc) != stripes[i].crc32c:\n",
        "        if False:\n",
        ("tests/client/test_erasure_codec.py::test_a_stripe_with_a_flipped_byte_is_never_used",),
        "a stripe whose bytes fail its crc32c is treated as lost and the file decoded from the "
        "others: a flipped byte in a stripe (and in the file decoded from it) never reaches a "
        "restore",
    ),
    Mutant(
        "erasure-file-crc",
        "    if written != file_size or crc32c_hex(file_crc) != file_crc32c:\n",
        "    if written != file_size:\n",
        (
            "tests/client/test_erasure_codec.py::"
            "test_a_decode_that_does_not_match_the_registered_crc_publishes_nothing",
        ),
        "a decoded file is checked against the shard's registered crc32c before it is published",
    ),
    Mutant(
        "stripe-read-error-is-a-lost-stripe",
        "    except (OSError, HTTPException, TierpointError) as e:\n",
        "    except OSError as e:\n",
        (
            "tests/client/test_erasure_fetch.py::"
            "test_a_parity_stripe_cut_off_in_transit_is_read_around_too",
        ),
        "a stripe that cannot be read (a holder dying mid-reply) is treated as lost and another "
        "stripe read in its place, never the end of the restore",
    ),
    Mutant(
        "joined-stripe-read-error-is-a-lost-stripe",
        "        except (OSError, HTTPException, TierpointError) as e:\n",
        "        except OSError as e:\n",
        ("tests/client/test_erasure_fetch.py::test_a_stripe_cut_off_in_transit_is_read_around",),
        "a data stripe that cannot be read while the file is joined from the data stripes is one "
        "lost stripe, decoded around with parity, never the end of the restore",
    ),
    Mutant(
        "joined-stripe-crc",
        "    if crc32c_hex(crc) != ref.crc32c:\n",
        "    if False:\n",
        ("tests/client/test_coded_read.py::test_a_data_stripe_with_a_flipped_byte_is_read_around",),
        "a data stripe joined into the file must match its crc32c, or it is left out and the "
        "file decoded from the others",
    ),
    Mutant(
        "joined-file-crc",
        "    if size != file_size or crc32c_hex(crc) != file_crc32c:\n",
        "    if size != file_size:\n",
        (
            "tests/client/test_erasure_fetch.py::"
            "test_stripes_that_match_but_do_not_give_the_registered_file_write_nothing",
        ),
        "a file joined from its data stripes is checked against the shard's registered crc32c "
        "before it is published",
    ),
    Mutant(
        "stripe-set-whole",
        "    return holders if len(holders) == code.width else None\n",
        "    return holders\n",
        (
            "tests/tierpoint/test_peer_code_config.py::"
            "test_a_stripe_set_goes_to_k_plus_m_distinct_nodes_in_distinct_domains",
        ),
        "a node's stripe set is placed on k+m distinct nodes or not at all: on fewer, one "
        "node's loss could take more than m stripes of the set",
    ),
    Mutant(
        "code-refused-at-start",
        "        if (problem := unplaceable(tier.name, code, known_nodes)) is not None:\n",
        "        if False:\n",
        (
            "tests/apps/test_coded_tier_start.py::"
            "test_a_code_wider_than_the_cluster_stops_the_shared_worker_at_start",
        ),
        "a coded peer tier the cluster cannot place is refused when the shared worker or the API "
        "starts",
    ),
    Mutant(
        "stripe-verified-only-when-it-matches",
        "        matches = and_(Stripe.size == r.size, Stripe.crc32c == r.crc32c)\n",
        "        matches = Stripe.size == r.size\n",
        (
            "tests/tierpoint/catalog/stripe/test_machine.py::"
            "test_a_stripe_is_verified_only_when_its_holder_reads_back_what_was_cut",
        ),
        "a stripe is verified only when its holder read back the size and crc32c the encoder cut",
    ),
    Mutant(
        "stripe-never-re-placed-beside-its-set",
        "            other.node_id == m.node,\n",
        "            other.node_id == m.node, other.id.is_(None),\n",
        (
            "tests/tierpoint/catalog/stripe/test_re_placing.py::"
            "test_a_stripe_is_never_re_placed_onto_a_holder_of_its_set_nor_from_a_good_state",
        ),
        "a rebuild never moves a stripe onto a node that holds another stripe of its set: one "
        "node's loss would take both",
    ),
    Mutant(
        "rebuilt-stripe-is-the-encoders",
        "            if cut_as != (stripe.size, stripe.crc32c):\n",
        "            if cut_as[0] != stripe.size:\n",
        (
            "tests/activities/test_rebuild.py::"
            "test_a_stripe_cut_again_other_than_the_encoder_recorded_is_never_written",
        ),
        "a stripe cut again by a rebuild is kept only when it is the size and crc32c the encoder "
        "recorded",
    ),
    Mutant(
        "abandoned-scratch-reclaimed",
        "            shutil.rmtree(entry.path, ignore_errors=True)\n",
        "            pass\n",
        (
            f"{SCRATCH}test_a_killed_attempts_scratch_is_reclaimed_by_the_next_and_a_live_ones_is_not",
            "tests/faults/test_coded_rebuild_killed.py::"
            "test_a_new_holder_killed_mid_rebuild[restarted]",
        ),
        "a rebuild's scratch left by a killed worker (a file's worth of fetched stripes) is "
        "reclaimed by the next rebuild on the node",
    ),
    Mutant(
        "live-scratch-never-reclaimed",
        "                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n",
        "                pass\n",
        (
            f"{SCRATCH}test_a_killed_attempts_scratch_is_reclaimed_by_the_next_and_a_live_ones_is_not",
        ),
        "a scratch directory that a live attempt holds is never reclaimed under it",
    ),
    Mutant(
        "rebuild-never-onto-a-holder-of-the-set",
        "    options = preference(node, sorted(set(serving)), domains, held)\n",
        "    options = preference(node, sorted(set(serving)), domains, ())\n",
        (
            "tests/activities/test_rebuild.py::"
            "test_a_lost_holders_stripes_are_cut_again_on_a_node_holding_none_of_the_set",
        ),
        "a lost stripe's new holder holds no other stripe of its set",
    ),
    Mutant(
        "node-lost-rebuilds-coded-copies",
        "    remade = [*placing, *_coded_to_rebuild(session, node, coded)]\n",
        "    remade = list(placing)\n",
        (
            "tests/tierpoint/catalog/stripe/test_re_placing.py::"
            "test_every_loss_of_a_holder_names_the_coded_copy_for_its_rebuild",
        ),
        "a node's loss starts (or tells) the rebuild of every coded copy it held stripes of",
    ),
    Mutant(
        "coded-copy-needs-k-stripes",
        "    not_decodable = sorted(s for s, n in counts.items() if n < code.k)\n",
        "    not_decodable = sorted(s for s, n in counts.items() if n < code.k - 1)\n",
        (
            "tests/tierpoint/catalog/stripe/test_coverage.py::"
            "test_a_coded_copy_stays_restorable_through_m_lost_holders_and_not_one_more",
        ),
        "a coded copy is restorable only while every shard keeps k verified stripes on holders "
        "not lost (invariant 1 for stripes)",
    ),
    Mutant(
        "node-lost-locks-checkpoints-first",
        "    lock_in_order(\n"
        "        session,\n"
        "        checkpoints=sorted({cp for cp, _ in pairs}),\n",
        "    lock_in_order(\n        session,\n        checkpoints=(),\n",
        (
            "tests/tierpoint/catalog/tier_copy/test_node_lost.py::"
            "test_a_declaration_and_a_retention_holding_the_checkpoint_do_not_deadlock",
        ),
        "a node's loss declaration waits for retention's hold on a checkpoint before it holds the "
        "checkpoint's tier copies, instead of closing a cycle with it",
    ),
    Mutant(
        "node-lost-loses-its-stripes",
        "    stripes.lose_on_node(session, node, reason)\n",
        "    pass\n",
        (
            "tests/tierpoint/catalog/stripe/test_coverage.py::"
            "test_a_coded_copy_stays_restorable_through_m_lost_holders_and_not_one_more",
        ),
        "a node declared lost takes the stripes it held with it",
    ),
    Mutant(
        "promote-coded-copy-whole",
        "    if got.promotable and stage_error is None:\n",
        "    if got.restorable and stage_error is None:\n",
        (
            "tests/tierpoint/catalog/stripe/test_coverage.py::"
            "test_a_coded_copy_is_promoted_through_its_stripes_only_when_every_set_is_whole",
        ),
        "a coded copy is promoted only when every shard has all k+m stripes verified on holders "
        "not lost",
    ),
    Mutant(
        "coded-copy-fails-only-below-k",
        "        if not coverage(coded[tier], verified_stripes(session, cp, tier)).restorable:\n",
        "        if False:\n",
        (
            "tests/tierpoint/catalog/stripe/test_coverage.py::"
            "test_a_lost_holder_fails_a_restorable_coded_copy_only_below_k_stripes",
        ),
        "a coded copy down to fewer than k verified stripes in a set is no longer restorable: "
        "latest and the restore go to the next tier",
    ),
    Mutant(
        "staged-stripe-served-while-placed",
        "            Stripe.state.in_(PULLABLE),\n",
        "            Stripe.state.is_not(None),\n",
        (
            "tests/tierpoint/test_data_endpoint_stripes.py::"
            "test_staged_stripes_are_served_to_their_holders_as_the_catalog_places_them",
        ),
        "a node serves a staged stripe only while the catalog places it there for its holder: "
        "not once its copy's expiry began",
    ),
    Mutant(
        "coded-copy-read-by-stripes",
        "    if entry.code is not None:\n",
        "    if False:\n",
        (
            "tests/client/test_restore_coded.py::"
            "test_a_coded_copy_is_decoded_from_its_holders_a_rotten_stripe_read_around",
        ),
        "the client's restore decodes a coded copy from its stripes",
        known_survivor="without the branch a coded copy is read through Sources.open as any "
        "copy, and Sources.open reads it with CodedSource (the reader's source), which decodes "
        "and checks it into memory: the restore still reads the stripes and publishes only "
        "checked bytes; the branch saves the file-sized buffer (the stripes are joined into "
        "the staged file)",
    ),
    Mutant(
        "coded-copy-short-of-k-falls-back",
        "    except (NotEnoughStripesError, FileMismatchError) as e:\n",
        "    except FileMismatchError as e:\n",
        (
            "tests/client/test_restore_coded.py::"
            "test_fewer_than_k_holders_falls_back_to_the_next_tier_or_writes_nothing",
        ),
        "a coded copy with fewer than k good stripes is given up like any copy: the next tier "
        "restores the file",
    ),
    Mutant(
        "coded-copy-read-by-the-reader",
        "        if entry.code is not None:\n",
        "        if entry.code is not None and False:\n",
        (
            "tests/client/torch/test_dcp_coded.py::"
            "test_a_load_reads_every_file_from_stripes_and_nothing_from_the_next_tiers",
        ),
        "TierpointReader reads a coded copy from its stripes, not as a peer copy it cannot read "
        "(which would send the load to the next tier)",
    ),
    Mutant(
        "placed-stripes-hash-held-bytes",
        "            return part.view[rel : rel + len(view)]\n",
        "            return view\n",
        (
            "tests/client/test_coded_read.py::"
            "test_a_head_flipped_in_transit_never_reaches_the_tensors",
        ),
        "bytes a placement read to decide (a tensor's head) are checked by the file's crc32c as "
        "they lie in the tensors, not as the stripe sent them again",
    ),
    Mutant(
        "coded-read-reads-around-a-bad-stripe",
        "            except StripeCorruptError as e:\n",
        "            except ZeroDivisionError as e:\n",
        (
            "tests/client/test_coded_read.py::"
            "test_a_stripe_gone_and_one_cut_off_in_transit_are_read_around",
        ),
        "a load leaves out a stripe that does not match its crc32c or cannot be read and decodes "
        "from another, rather than giving up the coded copy",
    ),
    Mutant(
        "coded-read-error-is-a-lost-stripe",
        "        except (OSError, HTTPException, TierpointError) as e:\n",
        "        except OSError as e:\n",
        (
            "tests/client/test_coded_read.py::"
            "test_a_stripe_gone_and_one_cut_off_in_transit_are_read_around",
        ),
        "a stripe its holder cannot serve is one lost stripe of the set, read around, not the "
        "end of the coded copy",
    ),
    Mutant(
        "load-reports-a-stripe-it-read-around",
        "            report_mismatched(entry, mismatched, self.report)\n",
        "            report_mismatched(entry, {}, self.report)\n",
        (f"{CODED_LOAD}test_a_stripe_flipped_in_transit_is_reported_read_back_good_and_kept",),
        "a stripe a load read around because its bytes did not match is reported, as a restore "
        "reports it, so its holder reads it back",
    ),
    Mutant(
        "load-reports-only-a-mismatched-stripe",
        "        mismatched = {i: stripe.why for i, stripe in left.items() if stripe.mismatch}\n",
        "        mismatched = {i: stripe.why for i, stripe in left.items()}\n",
        (f"{CODED_LOAD}test_stripes_that_cannot_be_read_or_do_not_match_are_read_around",),
        "a stripe a load could not read (its holder cannot serve it) is not reported: that says "
        "nothing of the bytes its holder keeps",
    ),
    Mutant(
        "load-reports-no-stripe-it-could-not-read",
        "                if not isinstance(e, _Unreadable):\n",
        "                if True:\n",
        (
            "tests/client/test_coded_read.py::"
            "test_only_the_stripes_whose_bytes_did_not_match_are_reported",
        ),
        "a stripe the decode could not read (a holder down, a reply cut off) is not reported: "
        "the holder's bytes may be good",
    ),
    Mutant(
        "stripe-judged-by-the-holders-read-back",
        '        crc = back.crc32c or "missing"\n',
        "        crc = stripe.crc32c\n",
        (
            "tests/activities/test_pull.py::"
            "test_a_stripe_rotten_in_the_staging_area_is_never_verified",
        ),
        "a pulled stripe is recorded with what its holder read back from its device, so it is "
        "verified only when those are the encoder's bytes",
    ),
    Mutant(
        "unstage-only-whole-sets",
        "            whole = [sh.id for sh in shards if counts.get(sh.id, 0) >= code.width]\n",
        "            whole = [sh.id for sh in shards]\n",
        (
            "tests/activities/test_pull.py::"
            "test_a_stripe_rotten_in_the_staging_area_is_never_verified",
        ),
        "a shard's staged stripes leave the staging area only once its whole set is verified on "
        "its holders: a holder whose pull failed can still pull again",
    ),
    Mutant(
        "stripes-staged-only-from-registered-bytes",
        "            if crc32c_hex(reader.crc) != crc32c:\n",
        "            if False:\n",
        ("tests/activities/test_encode.py::test_a_file_changed_after_its_seal_stages_no_stripe",),
        "a node's encoder stages and places stripes only from a file whose bytes, read in the "
        "same pass, are the registered crc32c",
    ),
    # ---- restores: what they read, and from where ---------------------------------------------
    Mutant(
        "restore-tier-only",
        "        tier = tier if tier is not None else latest.tier\n",
        "        tier = tier\n",
        ("tests/client/test_restore_tier_only.py",),
        "a plan that latest() gave for one tier is restored from that tier only",
    ),
    Mutant(
        "restore-progress-once",
        "        progress.add(-counted)\n",
        "        pass\n",
        ("tests/client/test_restore_plan.py::test_progress_counts_a_fallback_read_once",),
        "the bytes of a copy that failed verification are not counted as restored",
    ),
    Mutant(
        "restore-falls-back-on-read-error",
        "            except (SourceError, ChecksumMismatchError) as err:\n",
        "            except ChecksumMismatchError as err:\n",
        (
            "tests/client/test_restore_fallback.py::"
            "test_a_missing_local_and_shared_file_is_read_from_s3",
            "tests/faults/test_restore_peer_holder_down.py",
        ),
        "a restore falling back on a read error: a copy that cannot be read (a file gone, a peer "
        "holder down but not declared lost) gives way to the shard's next verified copy",
    ),
    Mutant(
        "restore-refuses-a-non-empty-dest",
        "        if names:\n",
        "        if False:\n",
        (
            "tests/client/test_restore_dest.py::"
            "test_a_directory_holding_files_is_refused_and_nothing_is_written",
        ),
        "a restore into a directory that holds files is refused, nothing written, unless told "
        "to overwrite or clean it: stale shards beside a restored checkpoint are loaded with it",
    ),
    Mutant(
        "restore-abort-leaves-dest-as-it-was",
        "                try:\n                    shutil.rmtree(self.staging)\n",
        "                try:\n                    pass\n",
        (
            "tests/client/test_restore_plan.py::test_mismatch_in_a_parallel_restore_raises",
            "tests/client/test_restore_dest.py::"
            "test_ctrl_c_mid_restore_leaves_dest_as_it_was_and_says_so",
        ),
        "a restore that fails or is interrupted removes what it staged: the destination is as "
        "it was, and the next restore into it is not refused for our leftovers",
    ),
    Mutant(
        "restore-cut-body",
        "        if not n and len(view) and resp.length:\n",
        "        if False:\n",
        (
            "tests/client/test_restore_streamed.py::"
            "test_a_cut_s3_body_is_a_read_error_not_a_mismatch",
            "tests/client/test_restore_streamed.py::"
            "test_a_cut_peer_body_is_a_read_error_not_a_mismatch",
        ),
        "a body cut off before its Content-Length is a read error, never a copy reported corrupt",
    ),
    Mutant(
        "restore-s3-connection-kept",
        "        s3.release(body)\n",
        "        body.close()\n",
        ("tests/client/test_restore_streamed.py::test_an_s3_connection_read_to_its_end_is_reused",),
        "an S3 body read to its end gives its connection back for the next object",
    ),
    # ---- checksums: seal, copy, verify -------------------------------------------------------
    Mutant(
        "seal-crc",
        "    if sh.checksum is not None and v.crc32c != sh.checksum.lower():\n",
        "    if False:\n",
        (WRONG_CRC,),
        "a sealed shard whose crc32c differs from the registered one is corrupt",
    ),
    Mutant(
        "copy-source-crc",
        "        if copied.crc32c != registered or copied.size != sh.size:\n",
        "        if copied.size != sh.size:\n",
        (ROTTING,),
        "bytes read off the source with the wrong crc32c mark the source corrupt",
    ),
    Mutant(
        "copy-readback",
        "        v = self._wait(pending.verify, sh.ordinal)\n",
        "        v = self._wait(pending.verify, sh.ordinal)\n"
        "        v = VerifyResult(ok=True, size=sh.size, crc32c=sh.checksum)\n",
        ("tests/faults/test_copy_damaged_before_verify.py",),
        "a copy whose read-back fails is not verified (a byte flipped on the destination between "
        "the write and the read-back)",
    ),
    Mutant(
        "posix-verify-crc",
        "        if crc != expected:\n",
        "        if False:\n",
        ("tests/tierpoint/storage/test_posix.py",),
        "POSIX verify compares the crc32c read from the device",
    ),
    Mutant(
        "s3-verify-crc",
        "        got = crc32c_hex(stored)\n        if stored != expected:\n",
        "        got = crc32c_hex(stored)\n        if False:\n",
        ("tests/tierpoint/storage/test_s3.py",),
        "S3 verify compares the stored (or read-back) crc32c",
    ),
    # ---- registration: a different manifest at a registered step is a 409 --------------------
    Mutant(
        "register-digest",
        "    if row.manifest_digest != digest:\n",
        "    if False:\n",
        ("tests/api/test_register.py",),
        "a different manifest for a registered step is refused",
    ),
    # ---- input limits and quarantine -----------------------------------------------------------
    Mutant(
        "body-limit-streamed",
        "                if seen > limit:\n",
        "                if False:\n",
        ("tests/api/test_limits.py::test_every_other_body_is_bounded",),
        "a body without Content-Length is refused once it streams past the limit",
    ),
    Mutant(
        "metadata-limit",
        "    if size > max_metadata_bytes:\n",
        "    if False:\n",
        ("tests/api/test_limits.py::test_twenty_megabytes_of_metadata_store_nothing",),
        "oversized metadata is refused before anything is stored",
    ),
    Mutant(
        "quarantine-expiring-copy",
        "        if reason is not None and target.state in _GONE:\n",
        "        if False:\n",
        (
            "tests/api/test_quarantine.py::test_refusals_change_nothing",
            "tests/tierpoint/catalog/holds/test_quarantine.py::"
            "test_a_copy_being_expired_cannot_be_quarantined_and_nothing_changes",
        ),
        "a copy retention is deleting is not reported as kept evidence",
    ),
    # ---- expiring before delete --------------------------------------------------------------
    Mutant(
        "delete-tier-copy-check",
        "            if state != TierState.EXPIRING.value:\n",
        "            if False:\n",
        (
            f"{RET_E2E}::test_crash_between_begin_and_delete_is_finished_by_the_next_run",
            "tests/activities/test_retention.py::"
            "test_an_expiry_runs_plan_begin_delete_per_node_and_finish",
        ),
        "the delete activity refuses a copy whose marker is not expiring",
    ),
    Mutant(
        "workflow-delete-before-begin",
        """        try:
            begun: BeginRoundResult = await workflow.execute_activity(
""",
        """        try:
            await asyncio.gather(*(self._delete(job, t) for t in tasks))
            begun: BeginRoundResult = await workflow.execute_activity(
""",
        (f"{RET_E2E}::test_lease_blocks_expiry_until_released_or_timed_out",),
        "bytes are deleted only after the marker is expiring (committed)",
    ),
    Mutant(
        "workflow-delete-whatever-begin-said",
        """                return False
            if begun.state is BeginState.EXPIRING:
                await self._delete(job, task)
""",
        """            await self._delete(job, task)
""",
        (RECHECK,),
        "a copy the re-check kept is not deleted",
    ),
    # ---- the dev stack owns its servers: never two on one data dir ----------------------------
    Mutant(
        "dev-servers-outlive-the-stack",
        """        prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
""",
        """        pass
""",
        (DEV_KILLED,),
        "Temporal and moto die with a `tierpoint dev` killed by SIGKILL",
    ),
    Mutant(
        "dev-restart-adopts-left-postgres",
        """        postmaster = postgres.stop_leftover()
""",
        """        postmaster = None
""",
        (DEV_KILLED,),
        "a restart stops the Postgres a killed stack left instead of running on top of it",
    ),
    Mutant(
        "dev-two-stacks-one-data-dir",
        """            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
""",
        """            pass
""",
        (DEV_REFUSED,),
        "a second `tierpoint dev` on a live stack's data dir refuses and stops none of its servers",
    ),
    Mutant(
        "dev-nodes-share-a-local-root",
        'and nodes > 1 and NODE not in (config.root or ""):',
        "and False:",
        (
            "tests/apps/devstack/test_dev_tiers.py::"
            "test_a_list_the_dev_stack_cannot_run_is_refused_in_one_line",
        ),
        "the dev stack's simulated nodes never share one local root (a root without {node})",
    ),
    # ---- access control: scopes, expiry, revocation ------------------------------------------
    Mutant(
        "auth-train-any-job",
        " and job.startswith(s[len(TRAIN) :])",
        "",
        (AUTH,),
        "a train:<prefix> token works only on jobs whose name starts with the prefix",
    ),
    Mutant(
        "auth-scope-ignored",
        "        return self.job_scoped and job is not None and principal.trains(job)\n",
        "        return True\n",
        (AUTH,),
        "a valid token whose scopes do not cover the route is refused (403)",
    ),
    Mutant(
        "auth-revocation-ignored",
        "    if token.revoked_at is not None and token.revoked_at <= now:\n",
        "    if False:\n",
        (AUTH,),
        "a revoked token is refused",
    ),
    Mutant(
        "auth-expiry-ignored",
        "    if token.expires_at is not None and token.expires_at <= now:\n",
        "    if False:\n",
        (AUTH,),
        "an expired token is refused",
    ),
    Mutant(
        "auth-before-validation",
        "            await admit(request, rule)\n",
        "            pass\n",
        ("tests/api/test_auth_first.py",),
        "401/403 come before a route's body, path or query is parsed: a malformed request from a "
        "stranger or a too narrow token never learns about the route from a 422",
    ),
    Mutant(
        "restore-without-lease-scope",
        "    LEASE_WRITE.check(principal, job)\n",
        "    pass\n",
        (
            "tests/api/test_restores.py::"
            "test_a_train_token_of_the_job_may_start_a_restore_a_reader_may_not",
        ),
        "starting a restore takes a lease: a token that may only read is refused (403), no lease",
    ),
    # ---- integrity: damage takes the tier out of restorable; repair never resurrects ----------
    Mutant(
        "damage-keeps-tier-copy-restorable",
        "return bool(move(session, locked, Move.DAMAGED, [(checkpoint_id, tier)], reason=reason))",
        "return bool([(checkpoint_id, tier)])",
        (
            "tests/tierpoint/catalog/tier_copy/test_damage.py::"
            "test_marking_bad_demotes_in_the_same_transaction_and_only_once",
            "tests/faults/test_scrub_bit_rot.py",
        ),
        "a replica found bad takes its tier's marker out of restorable in the same transaction",
    ),
    Mutant(
        "repair-touches-expiring-copies",
        """REPAIRABLE = (TierState.FAILED.value, TierState.RESTORABLE.value)
""",
        """REPAIRABLE = tuple(s.value for s in TierState)
""",
        (
            "tests/tierpoint/catalog/tier_copy/test_repair.py::"
            "test_repair_plans_only_tiers_it_may_touch_and_shards_with_a_source",
        ),
        "repair never copies into a copy retention is expiring or the lifecycle is still making",
    ),
    Mutant(
        "token-bootstrap-once",
        """    if existing is not None:
        return _view(existing)
""",
        """    if False:
        return _view(existing)
""",
        (
            "tests/apps/cli/test_token_bootstrap.py::"
            "test_bootstrap_makes_one_admin_token_however_often_it_runs",
            "tests/tierpoint/catalog/token/test_tokens.py::"
            "test_the_first_admin_token_is_made_once_and_again_after_revocation",
        ),
        "a bootstrap run again (a retried Job, a second operator) makes no second admin token",
    ),
    # ---- pins, leases and quarantines against an expiry in progress -------------------------
    Mutant(
        "pin-refused-during-expiry",
        "    if pinned and (expiring := expiring_tiers(session, checkpoint_id)):\n",
        "    if False:\n",
        (
            "tests/api/test_expiry_races.py::"
            "test_a_pin_waiting_for_a_begun_expiry_is_refused_naming_the_tiers",
            "tests/tierpoint/catalog/holds/test_pins.py::"
            "test_a_pin_during_an_expiry_is_refused_naming_the_tiers_and_changes_nothing",
        ),
        "a pin is not accepted for a checkpoint whose copy retention is already deleting",
    ),
    Mutant(
        "lease-waits-for-expiry",
        "lock=LEASE_LOCK)",
        "lock=None)",
        ("tests/api/test_lease_locking.py::test_lease_waits_for_an_expiry_and_is_refused",),
        "a lease locks the checkpoint row before it reads which tiers are restorable: it waits "
        "for a flip to expiring in progress and sees it (its insert's own key-share lock would "
        "wait too, but after the read)",
    ),
    Mutant(
        "lease-only-if-restorable",
        "row = row.where(_restorable(checkpoint_id))",
        "row = row",
        (
            "tests/tierpoint/catalog/holds/test_leases.py::"
            "test_only_a_checkpoint_restorable_from_some_tier_is_leased",
            "tests/api/test_lease_locking.py::test_lease_waits_for_an_expiry_and_is_refused",
        ),
        "a lease is inserted only if the checkpoint is restorable from some tier, read in the "
        "statement after the row lock: nothing to hold is a 409, never a lease on expiring bytes",
    ),
    Mutant(
        "last-release-requests-retention",
        "if not held:",
        "if False:",
        (
            "tests/workflows/test_retention_lease_release.py::"
            "test_a_storm_of_releases_asks_once_and_the_last_release_gets_the_copy_expired",
        ),
        "the release that leaves a checkpoint unleased asks for the retention run that expires "
        "what the leases held",
    ),
    Mutant(
        "restore-lease-waits-for-expiry",
        "lock_checkpoint(session, best[1], LEASE_LOCK)",
        "None",
        (
            "tests/api/test_lease_locking.py::"
            "test_latest_with_lease_waits_for_an_expiry_and_chooses_another",
        ),
        "latest with a lease locks the chosen checkpoint before it reads its plan: a flip to "
        "expiring in progress sends it to an older step, never to bytes being deleted",
    ),
    # ---- a copy's finding of a corrupt source: the scrub's outcome -----------------------------
    Mutant(
        "copy-source-found-corrupt-demotes",
        "            mark_damaged_shards(s, tier, errors, ReplicaState.CORRUPT, "
        """f"copy to {self._tier}")\n""",
        "            pass\n",
        (ROTTING,),
        "a source replica a copy found corrupt is marked and its tier demoted",
    ),
    Mutant(
        "lifecycle-repairs-corrupt-source",
        "        if self._source_damaged and workflow.patched(SOURCE_REPAIR_PATCH):\n",
        "        if False:\n",
        ("tests/workflows/test_repair.py",),
        "a lifecycle whose copy found its source corrupt asks for the checkpoint's repair",
    ),
    Mutant(
        "stage-sums-source-damage",
        "                    source_damaged += done.source_damaged\n",
        "                    source_damaged = done.source_damaged\n",
        (
            "tests/workflows/test_repair.py::"
            "test_a_source_found_corrupt_by_the_batch_that_finishes_first_still_asks_for_repair",
        ),
        "a stage counts every batch's finding of a corrupt source, not only the last batch's",
    ),
    Mutant(
        "stage-child-catches-up-on-lost-nodes",
        "        if missed and workflow.patched(CHILD_LOST_CATCH_UP_PATCH):\n",
        "        if False:\n",
        ("tests/workflows/test_stage_children_catch_up.py",),
        "a stage child started after a node was declared lost, which its input does not name, is "
        "told of it once it exists, rather than waiting on that node's queue for good",
    ),
    Mutant(
        "coded-passes-in-children",
        "        if len(stage.batches) <= size or not workflow.patched(CODED_CHILDREN_PATCH):\n",
        "        if True:\n",
        ("tests/workflows/test_stage_children.py",),
        "a coded tier's copy over more batches than a child holds runs each pass in children, so "
        "the lifecycle's history does not grow with nodes, and a lost node reaches them",
    ),
    Mutant(
        "coded-children-behind-patch",
        "        if len(stage.batches) <= size or not workflow.patched(CODED_CHILDREN_PATCH):\n",
        "        if len(stage.batches) <= size:\n",
        ("tests/workflows/test_replay.py::test_replay[lifecycle_coded_many_batches]",),
        "a coded run under way before its passes ran in children keeps its commands",
    ),
    Mutant(
        "repair-again-after-stale-plan",
        "        return plan.more or (again and workflow.patched(REPAIR_AGAIN_PATCH))\n",
        "        return plan.more\n",
        (
            "tests/workflows/test_repair.py::"
            "test_a_source_gone_since_the_plan_is_marked_and_later_rounds_finish_the_repair",
        ),
        "a repair whose plan went stale (a source gone, a faster source back) does not stop "
        "with the tier failed while rounds still change something",
    ),
    Mutant(
        "tier-view-counts-quarantined-copies",
        "            if m.state == RESTORABLE and m.quarantine_reason is None:\n",
        "            if m.state == RESTORABLE:\n",
        (
            "tests/api/test_quarantine.py::test_a_tier_does_not_count_a_corrupt_replica_as_verified",
            "tests/tierpoint/catalog/reads/test_checkpoint_views.py::"
            "test_a_restorable_copy_is_whole_but_a_quarantined_one_counts_its_replicas",
        ),
        "a tier never reports a shard verified that a read proved corrupt",
    ),
    # ---- a training job's quarantine hides; only an operator's holds storage -----------------
    Mutant(
        "planner-quarantine-evidence-only",
        "    if (c.quarantined and c.evidence) or (copy.quarantined and copy.evidence):\n",
        "    if c.quarantined or copy.quarantined:\n",
        PLANNER_TESTS,
        "a training job's quarantine does not exempt its copies from retention",
    ),
    Mutant(
        "quarantine-evidence-needs-operate",
        "        evidence=principal.has(Scope.OPERATE),\n",
        "        evidence=True,\n",
        (
            "tests/api/test_quarantine.py::"
            "test_a_training_jobs_quarantine_hides_but_does_not_hold_storage",
        ),
        "only operate or admin make a quarantine evidence that retention keeps",
    ),
    # ---- operators: a retry that could never finish, expired copies, deletion ----------------
    Mutant(
        "retry-without-source",
        """    if gone:
        what = """,
        """    if False:
        what = """,
        (
            "tests/api/test_retry.py::"
            "test_retry_without_a_verified_source_is_refused_and_changes_nothing",
            "tests/api/test_failures_after_restart.py::"
            "test_after_a_restart_only_the_lost_checkpoints_fail_and_are_acknowledged_by_reason",
            "tests/tierpoint/catalog/tier_copy/test_retry.py::"
            "test_a_retry_is_refused_only_where_it_cannot_help",
        ),
        "a retry whose run must pass an expired tier would leave the failed tier pending for good",
    ),
    Mutant(
        "retry-during-repair",
        """    if rebuilt:
""",
        """    if False:
""",
        (
            "tests/api/test_failures_after_restart.py::"
            "test_a_retry_while_a_repair_copies_the_copy_back_is_refused_and_said",
            "tests/tierpoint/catalog/tier_copy/test_retry.py::"
            "test_a_retry_is_refused_only_where_it_cannot_help",
        ),
        "a retry while a repair copies the copy back would run a second copy of the same shards "
        "beside the repair's",
    ),
    Mutant(
        "expired-replica-overwritten",
        "[None, PENDING, COPYING, CORRUPT, LOST],",
        "[None, PENDING, COPYING, CORRUPT, LOST, EXPIRED],",
        ("tests/api/test_retry.py::test_a_reseal_never_marks_an_expired_replica",),
        "a copy retention deleted on purpose is never re-marked corrupt by a reseal",
    ),
    Mutant(
        "delete-ignores-protection",
        """    if protected and not force:
""",
        """    if False:
""",
        (
            "tests/api/test_acknowledge_delete.py::"
            "test_a_deleted_checkpoint_goes_through_expiry_and_its_step_comes_back",
            "tests/api/test_acknowledge_delete.py::"
            "test_deleting_a_job_deletes_every_checkpoint_and_keeps_the_job",
            "tests/tierpoint/catalog/checkpoint/test_deletion.py::"
            "test_a_protected_checkpoint_is_refused_without_force_and_nothing_changes",
        ),
        "a pinned or leased checkpoint is deleted only with force",
    ),
    Mutant(
        "delete-replaces-while-expiring",
        """    if expiring:
        raise CheckpointBeingDeleted(""",
        """    if False:
        raise CheckpointBeingDeleted(""",
        (
            "tests/api/test_acknowledge_delete.py::"
            "test_registering_a_step_being_deleted_waits_for_its_expiry",
        ),
        "a deleted step is registered again only once its old copies are gone",
    ),
    # ---- the DCP reader: a placed or streamed read verifies the whole file -------------------
    Mutant(
        "placed-read-crc",
        """    actual = crc32c_hex(crc)
    if entry.crc32c is not None and actual != entry.crc32c.lower():
        raise Mismatch(f"crc32c {actual}, registered {entry.crc32c}")
""",
        """    return
""",
        ("tests/client/torch/test_dcp.py::test_a_corrupt_shared_copy_is_read_from_s3",),
        "a copy whose bytes were read into the tensors must verify, or the next copy replaces them",
    ),
    Mutant(
        "striped-read-hashes-placed-bytes",
        "                crcs.append(update(0, view))\n",
        "                crcs.append(update(0, into))\n",
        (
            "tests/client/torch/test_dcp_peer_striped.py::"
            "test_a_flipped_byte_is_a_mismatch_and_the_next_copy_is_read",
        ),
        "a striped peer read verifies the bytes left in memory (a head read to decide among "
        "them), not the stripe's copy of them that it dropped",
    ),
    # ---- the training side of a run's timeline -----------------------------------------------
    Mutant(
        "writer-resaves-only-superseded",
        "        if found.superseded_by is not None:\n",
        "        if True:\n",
        (
            "tests/client/torch/test_timeline_dcp.py::"
            "test_a_load_that_rolls_back_saves_the_steps_after_it_again",
        ),
        "a step still on the job's timeline is refused before any rank writes over its files; "
        "only one a rollback superseded is saved again",
    ),
    Mutant(
        "writer-branch-directory",
        "        directory = step_dir(self.step, self.branch or 1)\n",
        "        directory = str(self.step)\n",
        (
            "tests/client/torch/test_timeline_dcp.py::"
            "test_a_load_that_rolls_back_saves_the_steps_after_it_again",
        ),
        "a step saved again on a later branch is written to its branch's own directory, never "
        "over the files of the checkpoint it supersedes",
    ),
    Mutant(
        "guard-nan-inf-is-a-failure",
        "        if not math.isfinite(value):\n",
        "        if False:\n",
        (
            "tests/client/test_guard.py::"
            "test_a_diverging_step_marks_the_loaded_checkpoint_bad_and_exits",
        ),
        "a NaN or Inf loss or grad norm after a load marks the loaded checkpoint bad and stops "
        "the run, so no restart loads it again",
    ),
    # ---- the peer tier: placement, the data endpoint, a lost holder ----------------------------
    Mutant(
        "peer-ring-never-self",
        """    walk = [n for n in (*ring[start:], *ring[:start]) if n != node]
""",
        """    walk = [n for n in (*ring[start:], *ring[:start])]
""",
        ("tests/activities/test_placement.py",),
        "a node's peer copy never sits on the node itself, whose loss it is there for",
    ),
    Mutant(
        "data-endpoint-worker-credential",
        """    if worker is not None and hmac.compare_digest(""",
        """    if worker is not None or hmac.compare_digest(""",
        (PEER_ENDPOINT,),
        "the data endpoint serves nothing to a wrong credential",
    ),
    Mutant(
        "data-endpoint-scope",
        """        if who is not None and not (who.has(auth.Scope.READ) or who.trains(job)):""",
        """        if False:""",
        (PEER_ENDPOINT,),
        "an API token reads over the data endpoint only the jobs its scopes cover",
    ),
    Mutant(
        "data-endpoint-client-auth",
        "                ctx.verify_mode = ssl.CERT_REQUIRED\n",
        "                pass\n",
        ("tests/workflows/test_peer_mtls.py",),
        "with mutual TLS on, the data endpoint serves no client without a certificate of its CA",
    ),
    Mutant(
        "data-endpoint-credential-first",
        "            who = authenticate(",
        "            data_path(self.path)\n            who = authenticate(",
        ("tests/tierpoint/test_data_endpoint_auth_first.py",),
        "a request without a valid credential is 401 whatever its path: a stranger learns "
        "nothing of the endpoint's path rules from a 400",
    ),
    Mutant(
        "data-endpoint-short-copy-refused",
        "            if held != size:\n",
        "            if False:\n",
        (
            "tests/faults/test_peer_truncated.py::"
            "test_a_peer_copy_truncated_at_rest_is_marked_at_its_first_read_and_made_again",
        ),
        "a copy shorter than registered is never promised (Content-Length) nor served, and is "
        "marked bad at its first read, so latest stops offering it and repair makes it again",
    ),
    Mutant(
        "data-endpoint-short-send-recorded",
        """                self._record(
                    tier,
""",
        """                (lambda *_: None)(
                    tier,
""",
        (
            "tests/faults/test_peer_truncated.py::"
            "test_a_peer_copy_truncated_while_it_is_served_is_a_read_error_and_made_again",
        ),
        "a copy found short while it is sent is marked bad before the reader's connection is "
        "cut: its read error is not the only trace of the damage",
    ),
    Mutant(
        "data-endpoint-verified-only",
        """            Replica.node_id == node,
            Replica.state == ReplicaState.VERIFIED.value,
""",
        """            Replica.node_id == node,
""",
        (
            PEER_ENDPOINT,
            "tests/tierpoint/catalog/replica/test_placement.py::"
            "test_a_node_serves_only_its_own_verified_copies",
        ),
        "the data endpoint serves only copies that were verified, never bytes a seal found bad",
    ),
    Mutant(
        "lost-holder-fails-peer-tier-copy",
        """    held = _fail_held_peer_copies(session, locked, node, peer_tiers, reason)""",
        """    held: dict[int, list[str]] = {}""",
        (PEER_E2E,),
        "a peer tier whose copy a lost node held stops being restorable, and is copied again",
    ),
    Mutant(
        "node-lost-fails-only-the-lost-nodes-copies",
        "    failed_tiers = _fail(session, locked, Move.NODE_LOST, own, local_tiers, reason)\n",
        "    failed_tiers = _fail(session, locked, Move.NODE_LOST, ids, local_tiers, reason)\n",
        (
            "tests/tierpoint/catalog/tier_copy/test_node_lost.py::"
            "test_a_lost_holder_fails_the_peer_copies_it_held_and_no_local_copy",
            "tests/faults/test_lost_holder_spares_local_copies.py",
        ),
        "a node that held only peer copies of a checkpoint takes no byte of its local copies: "
        "they stay restorable (latest keeps the newest step) and retention expires them as usual",
    ),
    Mutant(
        "rereplication-chooses-distinct-holders",
        "        options = preference(node, ring, domains, others | set(given.values()))\n",
        "        options = preference(node, ring, domains, set(given.values()))\n",
        (
            "tests/activities/test_placement.py::"
            "test_a_copy_made_again_never_goes_beside_another_copy",
            "tests/faults/test_rereplication_distinct_holders.py",
        ),
        "a lost holder's copy is made again on a node holding none of the node's other copies "
        "(K copies on K nodes), or not at all and said so, never beside another copy",
    ),
    Mutant(
        "peer-cut-body-is-an-error",
        "            if n == 0 and len(b) and self._left:\n",
        "            if False:\n",
        ("tests/faults/test_peer_endpoint_killed.py",),
        "a pull cut off by the source's endpoint dying is retried and resumed, never taken for a "
        "short source (which would mark the source's verified copy corrupt)",
    ),
    Mutant(
        "peer-transit-mismatch-spares-source",
        "        remote = isinstance(self.src, PeerSource)\n",
        "        remote = False\n",
        ("tests/faults/test_peer_byte_flipped.py",),
        "bytes damaged on the network are read again and never condemn the source's good copy",
    ),
    Mutant(
        "rereplicate-plans-again-after-loss",
        "            workflow.continue_as_new(inp)\n",
        "            pass\n",
        (
            "tests/faults/test_peer_holder_lost_during_rereplication.py",
            "tests/workflows/test_coded_rebuild.py",
        ),
        "a new holder lost during re-replication is replaced, so the checkpoint gets its copy back "
        "(a coded copy its lost stripes)",
    ),
    Mutant(
        "rereplicate-below-verified-only",
        """            Replica.tier.in_(list(tiers)),
            Replica.state == ReplicaState.VERIFIED.value,
""",
        """            Replica.tier.in_(list(tiers)),
""",
        (
            "tests/workflows/test_peer.py::"
            "test_a_lost_nodes_shards_are_copied_again_from_the_tiers_below",
            "tests/tierpoint/catalog/replica/test_placement.py::"
            "test_the_shards_a_tier_still_lacks_and_where_they_can_be_read_again",
        ),
        "a lost node's shards are copied again only from a tier below that holds them verified "
        "(a corrupt copy there is passed over for the next tier down)",
    ),
    Mutant(
        "planner-failed-copy-needs-a-lost-node",
        "        return copy.on_lost_node and kind in NODE_TIER_KINDS and not rebuilding(copy)\n",
        "        return kind in NODE_TIER_KINDS and not rebuilding(copy)\n",
        ("tests/tierpoint/retention/test_planner_lost_nodes.py", *PLANNER_TESTS),
        "a failed local or peer copy that no lost node took part of stays the operator's",
    ),
    # ---- retention and copies being made again (re-replication, repair) ----------------------
    Mutant(
        "planner-rebuild-source",
        "        why.append(KeepReason.REBUILD_SOURCE)\n",
        "        pass\n",
        (REBUILD_PLANNER, *PLANNER_TESTS),
        "the copy a re-replication or repair reads from stays while that rebuild holds it",
    ),
    Mutant(
        "planner-rebuilt-copy-in-flight",
        "        return copy.on_lost_node and kind in NODE_TIER_KINDS and not rebuilding(copy)\n",
        "        return copy.on_lost_node and kind in NODE_TIER_KINDS\n",
        (REBUILD_PLANNER, *PLANNER_TESTS),
        "a lost node's failed copy that a rebuild is making again is in flight, not expired",
    ),
    Mutant(
        "planner-hold-is-no-last-copy",
        "        return key not in self.expire and bool(why)"
        " and why != [KeepReason.REBUILD_SOURCE]\n",
        "        return key not in self.expire\n",
        (REBUILD_PLANNER, *PLANNER_TESTS),
        "a copy only a rebuild's hold keeps never stands in for a checkpoint's lasting last copy",
    ),
    Mutant(
        "snapshot-reads-rebuild-hold",
        "            rebuild_from=frozenset(m.rebuild_from or ())\n",
        "            rebuild_from=frozenset()\n",
        (REBUILD_CATALOG,),
        "the planner and the re-check under locks see a rebuild's hold until it lapses",
    ),
    Mutant(
        "rereplication-holds-its-sources",
        "                rebuild.hold_sources(s, inp.checkpoint_id, tier.name, reads, now)\n",
        "                pass\n",
        ("tests/workflows/test_retention_during_rereplication.py",),
        "a retention run during re-replication leaves the shared copy it reads alone",
    ),
    Mutant(
        "repair-holds-its-sources",
        "            hold_sources(session, checkpoint_id, dst.name, reads, now)\n",
        "            pass\n",
        (
            "tests/tierpoint/catalog/tier_copy/test_repair.py::"
            "test_repair_holds_the_tiers_it_reads_against_retention_until_promoted",
        ),
        "a repair holds the copies it reads from against retention, faster and slower tiers alike",
    ),
    Mutant(
        "promotion-releases-the-hold",
        "        release(session, checkpoint_id, tier)\n",
        "        pass\n",
        (REBUILD_CATALOG, "tests/workflows/test_retention_during_rereplication.py"),
        "a rebuild made or given up releases its sources to the policy",
    ),
    # ---- S3 credentials per tier and the API's TLS ---------------------------------------------
    Mutant(
        "tier-credentials-never-fall-back",
        "    if not key or not secret:\n",
        "    if False:\n",
        (
            "tests/tierpoint/storage/test_s3_credentials.py::"
            "test_missing_variables_fail_instead_of_using_the_chain",
        ),
        "a tier naming missing key variables fails instead of signing with the AWS chain's keys",
    ),
    Mutant(
        "dev-stack-keys-only-for-its-s3",
        '                tier["credentials_env"] = S3_CREDENTIALS_ENV\n',
        "                pass\n",
        ("tests/apps/devstack/test_stack_files.py",),
        "the dev stack's own S3 tiers, and only they, sign with the embedded S3's keys",
    ),
    Mutant(
        "api-mutual-tls-requires-a-certificate",
        '        options["ssl_cert_reqs"] = ssl.CERT_REQUIRED\n',
        '        options["ssl_cert_reqs"] = ssl.CERT_OPTIONAL\n',
        ("tests/deploy/test_api_tls.py::test_mutual_tls_admits_only_clients_of_its_ca",),
        "with a client CA, the API refuses a client without a certificate of that CA",
    ),
    Mutant(
        "purge-deletes-newest",
        "    if newest is not None and newest in ids:\n",
        "    if False:\n",
        ("tests/api/test_purge.py::test_a_job_purges_its_old_steps_never_its_newest_restorable",),
        "a training job's purge never deletes the job's newest restorable checkpoint",
    ),
    Mutant(
        "fs-step-saved-once",
        "            _refuse_registered(client, path.job, path.step)\n",
        "            pass\n",
        (
            "tests/client/torch/test_fsspec_dcp.py::test_a_registered_step_is_not_saved_again",
            "tests/client/torch/test_fsspec_dcp.py::"
            "test_bad_url_missing_token_and_foreign_job_fail_before_anything_is_written",
        ),
        "a save by tierpoint:// URL never rewrites a registered step's files, nor starts for a "
        "job its token may not use",
    ),
    Mutant(
        "fs-save-authorized",
        "    client.authorize_registration(job)\n",
        "    pass\n",
        (
            "tests/client/torch/test_fsspec_dcp.py::"
            "test_bad_url_missing_token_and_foreign_job_fail_before_anything_is_written",
        ),
        "a save by tierpoint:// URL with a token that may read the job but not register its "
        "checkpoints fails before a byte is written, not at the registration",
    ),
    Mutant(
        "fs-transaction-discard-registers-nothing",
        "            if commit:\n",
        "            if True:\n",
        (
            "tests/client/trainers/test_fabric.py::"
            "test_a_given_up_transaction_registers_and_leaves_nothing",
        ),
        "a tierpoint:// save inside an fsspec transaction (Lightning's) that is given up "
        "registers nothing",
    ),
    # ---- a run's timeline ----------------------------------------------------------------------
    Mutant(
        "register-on-left-branch",
        "    if asked is None or asked == current:\n",
        "    if True:\n",
        (
            TIMELINE_ROLLBACK,
            "tests/tierpoint/catalog/checkpoint/test_placement_on_timeline.py::"
            "test_a_registration_is_saved_on_the_current_branch_only",
        ),
        "a writer still running on a branch a rollback left cannot add to the timeline",
    ),
    Mutant(
        "rollback-race-loser",
        "        if head.created_by == actor and from_branch in (None, head.parent):\n",
        "        if True:\n",
        (TIMELINE_ROLLBACK,),
        "a racing rollback to the same step by another caller is told who won, not taken for ours",
    ),
    Mutant(
        "rollback-job-lock-no-key-update",
        "with_for_update(key_share=True)\n",
        "with_for_update()\n",
        (
            "tests/api/test_timeline_races.py::"
            "test_a_rollback_and_a_promotion_of_a_step_it_supersedes_both_commit",
        ),
        "a rollback never deadlocks with a promotion's event on the job it rolls back",
    ),
    Mutant(
        "rollback-retry-only-before-saves",
        "        and not _saved_since(session, job_id, current, step)\n",
        "        and True\n",
        (
            f"{TIMELINE_ROLLBACK}::"
            "test_a_second_rollback_to_the_same_step_after_saving_again_goes_back_again",
        ),
        "a rollback to the same step after the run saved again goes back again, not a retry",
    ),
    Mutant(
        "rollback-target-restorable",
        "    if why is not None:\n",
        "    if False:\n",
        (
            TIMELINE_ROLLBACK,
            "tests/tierpoint/catalog/timeline/test_branches.py::"
            "test_a_rollback_to_a_step_it_cannot_use_is_refused",
        ),
        "a rollback goes back only to a checkpoint that can be restored",
    ),
    Mutant(
        "latest-skips-superseded",
        "        q = q.where(ct.superseded.is_(False))\n",
        "        q = q\n",
        (TIMELINE_ROLLBACK,),
        "latest never answers a checkpoint a rollback superseded",
    ),
    Mutant(
        "verdict-transitions",
        "    if (before, verdict) not in TRANSITIONS:\n",
        "    if False:\n",
        (
            "tests/api/test_verdicts.py::test_bad_quarantines_and_latest_good_walks_back",
            "tests/tierpoint/catalog/timeline/test_verdicts.py::"
            "test_verdicts_move_by_the_table_and_bad_is_final",
        ),
        "a bad verdict is final",
    ),
    Mutant(
        "fork-cycle",
        "    if existing is not None and _descends_from(session, parent.job_id, existing):\n",
        "    if False:\n",
        (
            TIMELINE_FORKS,
            "tests/tierpoint/catalog/timeline/test_lineage.py::"
            "test_a_fork_starts_a_new_job_once_and_never_closes_a_cycle",
        ),
        "a job is never forked from itself or its own descendants",
    ),
    Mutant(
        "fork-reads-parent",
        "    JOB_READ.check(principal, body.parent.job)\n",
        "    pass\n",
        (TIMELINE_FORKS,),
        "a fork reads its parent: the token must be allowed to read the parent job",
    ),
    Mutant(
        "planner-newest-good",
        "        why.append(KeepReason.NEWEST_GOOD)\n",
        "        pass\n",
        (
            *PLANNER_TESTS,
            "tests/api/test_verdicts.py::test_bad_quarantines_and_latest_good_walks_back",
        ),
        "retention never expires a job's newest good checkpoint",
    ),
    Mutant(
        "planner-fork-parent",
        "        why.append(KeepReason.FORK_PARENT)\n",
        "        pass\n",
        (
            *PLANNER_TESTS,
            TIMELINE_FORKS,
            "tests/workflows/test_timeline_races_live.py::"
            "test_a_fork_racing_the_parents_retention_run_keeps_what_the_child_needs",
        ),
        "retention keeps a checkpoint a forked job still needs",
    ),
    # ---- a run's timeline: every route, report and workflow names a checkpoint ---------------
    Mutant(
        "workflow-ids-per-checkpoint",
        'where = str(step) if branch == 1 else f"{step}.b{branch}"',
        "where = str(step)",
        ("tests/api/test_timeline_workflow_ids.py",),
        "the two checkpoints of a step saved again after a rollback have workflows of their own: "
        "a repair or verification of one never joins or signals the other's run",
    ),
    Mutant(
        "restore-names-the-fork-parent",
        "owner, step, branch = found.job, found.step, found.checkpoint.branch",
        "owner, step, branch = job, found.step, found.checkpoint.branch",
        (
            "tests/client/torch/test_timeline_dcp.py::"
            "test_a_forks_first_load_reads_the_parent_and_reports_its_corrupt_copy_there",
        ),
        "a fork's first restore answers its parent's checkpoint under the parent's job, whose "
        "files they are: under the child's name a fork's first load fails",
    ),
    Mutant(
        "reader-reports-on-the-checkpoint-read",
        "job, step = checkpoint.job, checkpoint.step",
        "job, step = self.job, checkpoint.step",
        (
            "tests/client/torch/test_timeline_dcp.py::"
            "test_a_forks_first_load_reads_the_parent_and_reports_its_corrupt_copy_there",
        ),
        "a corrupt copy found while a fork loads its parent is reported on the parent's "
        "checkpoint, never on the child job",
    ),
    Mutant(
        "purge-keeps-the-timelines-newest",
        "            Checkpoint.superseded_by.is_(None),\n",
        "            Checkpoint.id.is_not(None),\n",
        (
            "tests/api/test_timeline_addressing.py::"
            "test_cached_copies_pins_and_purges_act_on_the_checkpoint_of_their_branch",
        ),
        "a purge never deletes the job's newest restorable checkpoint of the timeline: a "
        "superseded step with a higher number is not it",
    ),
    Mutant(
        "downgrade-refuses-a-timeline",
        "    if later:\n",
        "    if False:\n",
        (
            "tests/tierpoint/catalog/test_migrate.py::"
            "test_a_catalog_that_rolled_back_refuses_to_go_below_0016_and_keeps_everything",
        ),
        "a catalog that rolled back is never downgraded below 0016: the refusal comes before "
        "anything changes",
    ),
    Mutant(
        "stripe-found-bad-is-marked",
        '        if machine.mark_bad(session, tier, [key], state, f"{actor}: {problems[key]}"):\n',
        "        if False:\n",
        (
            "tests/tierpoint/catalog/tier_copy/test_stripe_damage.py::"
            "test_stripes_found_bad_stop_counting_and_fail_the_copy_only_below_k",
            CODED_SCRUB,
        ),
        "a stripe a scrub (or a holder's check of a reader's report) read back bad is moved out "
        "of `verified`: coverage never counts it, and a restore is never offered it",
    ),
    Mutant(
        "stripe-damage-fails-copy-below-k",
        "    if coverage(code, verified_stripes(session, checkpoint_id, tier)).restorable:\n",
        "    if True:\n",
        (
            "tests/tierpoint/catalog/tier_copy/test_stripe_damage.py::"
            "test_stripes_found_bad_stop_counting_and_fail_the_copy_only_below_k",
            "tests/activities/test_reconcile_staging.py::"
            "test_reconciliation_that_leaves_a_set_below_k_fails_the_restorable_coded_copy",
            CODED_SCRUB,
        ),
        "a coded copy left below k verified stripes in some set by stripes found bad is no "
        "longer restorable: latest and the restore go to the next tier",
    ),
    Mutant(
        "stripe-found-bad-asks-rebuild",
        "    ask_rebuild(inp.tier, {t.checkpoint_id for t in todo})\n",
        "    pass\n",
        (
            "tests/faults/test_coded_stripe_repair.py::"
            "test_a_stripe_the_scrub_finds_bad_is_cut_again_and_the_copy_stays_restorable",
            CODED_SCRUB,
        ),
        "a stripe a holder's scrub (or an operator's verify, or a confirmed report) found bad is "
        "cut again by its copy's rebuild, asked for once the move is committed: never left bad "
        "until a node is lost",
    ),
    Mutant(
        "repair-asks-rebuild-of-bad-stripes",
        "                stripe_rebuild.ask_due(\n",
        "                (lambda *_: None)(\n",
        (
            "tests/faults/test_coded_stripe_repair.py::"
            "test_an_operators_verify_and_a_repair_cut_a_coded_copys_bad_stripes_again",
        ),
        "a repair of a checkpoint routes its coded copy's stripes found bad to the copy's "
        "rebuild (the one home of a coded copy's redundancy): a finding whose own ask was lost "
        "is cut again",
    ),
    Mutant(
        "reconcile-asks-rebuild-of-bad-stripes",
        "            self.ask_rebuild(self.tier.name, bad)\n",
        "            pass\n",
        (
            "tests/activities/test_reconcile_staging.py::"
            "test_reconciliation_that_leaves_a_set_below_k_fails_the_restorable_coded_copy",
        ),
        "a stripe reconciliation records found bad on its holder is cut again by its copy's "
        "rebuild, asked for after the commit and again by a retry",
    ),
    Mutant(
        "coded-rebuild-holds-its-own-copy",
        "    _hold(session, checkpoint_id, tier, [tier], now)\n",
        "    release(session, checkpoint_id, tier)\n",
        (
            "tests/faults/test_coded_stripe_repair.py::"
            "test_retention_keeps_a_coded_copy_while_its_rebuild_reads_its_stripes",
        ),
        "retention never expires a coded copy while its rebuild reads the copy's own stripes to "
        "cut the lost or bad ones again: the rebuild's plan holds the copy itself",
    ),
    Mutant(
        "stripe-scrub-checks-crc32c",
        "    if v.crc32c != t.crc32c.lower():\n",
        "    if False:\n",
        (CODED_SCRUB,),
        "a holder's scrub judges each stripe by the encoder's crc32c, not its size alone: a "
        "flipped byte at rest is found",
    ),
    Mutant(
        "coded-tier-costs-its-stripes",
        "    return round(held_bytes(tier, nbytes) / GB * price_per_gb_month(tier), 6)\n",
        "    return round(nbytes / GB * price_per_gb_month(tier), 6)\n",
        (CODED_VIEWS,),
        "a coded peer tier is priced for the stripes it holds, (k+m)/k of the files' bytes",
    ),
    Mutant(
        "coverage-view-counts-verified-stripes",
        "        Stripe.state == ReplicaState.VERIFIED.value,\n",
        "        Stripe.state != ReplicaState.EXPIRED.value,\n",
        (CODED_VIEWS,),
        "the views' coverage of a coded copy counts only verified stripes: a stripe found bad "
        "shows as a set short of it",
    ),
    Mutant(
        "reported-stripe-is-read-back-on-its-holder",
        "    inp = VerifyInput(\n        tier=r.tier, node=ref.holder,",
        "    inp = VerifyInput(\n        tier=r.tier, node=None,",
        (CODED_REPORT,),
        "a reader's report of a stripe is judged by the stripe's holder reading it back from "
        "its own device, never on the reader's word",
    ),
    Mutant(
        "only-a-mismatched-stripe-is-reported",
        '        return _Problem(f"stripe {ref.index} from {ref.where}: {e!r}", mismatch=False)\n',
        '        return _Problem(f"stripe {ref.index} from {ref.where}: {e!r}", mismatch=True)\n',
        (
            "tests/client/test_erasure_fetch.py::"
            "test_a_parity_stripes_holder_down_is_read_around_and_not_reported",
        ),
        "a stripe that could not be read (a holder down, a connection cut) is never reported "
        "as corrupt: it says nothing of the bytes its holder keeps",
    ),
    Mutant(
        "fork-forgets-peer-connections",
        "        os.register_at_fork(after_in_child=forget)\n",
        "        del forget\n",
        (f"{FORK_SAFETY}test_a_forked_child_reads_peer_and_s3_copies_on_connections_of_its_own",),
        "a forked child never sends on its parent's kept connections to a data endpoint (two "
        "readers of one socket)",
    ),
    Mutant(
        "fork-forgets-s3-clients",
        "os.register_at_fork(after_in_child=_forget_clients)\n",
        "_forget_clients.__name__\n",
        (f"{FORK_SAFETY}test_a_forked_child_reads_peer_and_s3_copies_on_connections_of_its_own",),
        "a forked child never reads S3 on its parent's pooled connections",
    ),
    Mutant(
        "fork-forgets-reader-pools",
        "os.register_at_fork(after_in_child=_forget_pools)\n",
        "_forget_pools.__name__\n",
        (f"{FORK_SAFETY}test_a_forked_child_reads_on_reader_threads_of_its_own",),
        "a forked child starts its own reader threads: its parent's pool, whose threads it does "
        "not have, never runs a task",
    ),
    Mutant(
        "fork-forgets-api-pool",
        "os.register_at_fork(after_in_child=_forget_requests)\n",
        "_forget_requests.__name__\n",
        (
            "tests/client/torch/test_dcp_fork.py::"
            "test_a_trainer_forked_after_a_load_loads_in_the_child_and_on_in_the_parent",
        ),
        "a load in a forked child asks the API beside its reads on threads of its own, never on "
        "its parent's pool (whose threads it does not have) or behind its parent's lock",
    ),
)
