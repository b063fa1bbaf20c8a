"""Seconds each integration module took, to order the suite (support/suite_order.py): longest first.

Measured by `.ci/run` (its JUnit report: the sum of each module's test times) on 2026-12-07, an Intel Xeon with
AMX, 2 vCPUs, on a fresh machine; the waits of `alone` holders for the other worker (the setup of
test_import_costs 159 s, test_container_executor 147 s, test_duet_e2e 108 s, test_gpu_check 75 s, test_system_image
98 s, test_no_orphans 52 s) taken out: they are where a module ran, not what it costs. Only the order depends on
these figures, never a result: a module missing here (a new one) is taken as UNKNOWN_S, and a figure that has
drifted moves a module within its group. To refresh: `.ci/run` prints where its JUnit report is; sum each
module's test times, less the setup of a test that waited for an `alone` holder (`--durations` lists them).
"""

from __future__ import annotations

UNKNOWN_S = 20.0  # a module not measured yet: among the fillers, as most modules are

SECONDS: dict[str, float] = {
    "test_system_image": 256,
    "test_multinode": 191,
    "test_noninferiority_e2e": 190,
    "test_gpu_check": 185,
    "test_verdict_round2_e2e": 169,
    "test_workload_train": 166,
    "test_vllm_engine": 165,
    "test_flow": 127,
    "test_main_job": 123,
    "test_workload_infer": 95,
    "test_verdict_e2e": 84,
    "test_cluster_build": 63,
    "test_ray_cluster": 60,
    "test_cluster_sim": 55,
    "test_paired_e2e": 54,
    "test_verdict_in_prefect": 54,
    "test_duet_e2e": 52,
    "test_attest": 51,
    "test_prefect_server": 50,
    "test_manifest_hostile_cli": 45,
    "test_reference_e2e": 39,
    "test_cli_gate": 36,
    "test_prefect_ui": 34,
    "test_release_images_e2e": 30,
    "test_ray_stream": 29,
    "test_ray_auth": 29,
    "test_service_limits": 27,
    "test_service_faults": 27,
    "test_pulls": 25,
    "test_container_duet": 25,
    "test_attest_flow": 24,
    "test_early_ray": 23,
    "test_process_end": 22,
    "test_bad_values_cli": 21,
    "test_no_orphans": 20,
    "test_driver_kill": 18,
    "test_build": 18,
    "test_promote_images": 16,
    "test_reports": 14,
    "test_wheel_install": 13,
    "test_store": 12,
    "test_promote": 11,
    "test_compare_history": 10,
    "test_container_executor": 10,
    "test_service_config": 7,
    "test_setup_overlap_e2e": 7,
    "test_ray_listeners": 7,
    "test_train_listeners": 6,
    "test_service_registry": 6,
    "test_service": 5,
    "test_service_api": 5,
    "test_concurrent_migrations": 5,
    "test_lean_check": 5,
    "test_train_cli": 4,
    "test_data_dir_keys": 4,
    "test_gate_service": 4,
    "test_suite_config": 3,
    "test_early_prefect_command": 2,
    "test_import_costs": 2,
    "test_registry": 2,
    "test_registry_secrets": 1,
    "test_procs": 1,
    "test_secret_hygiene": 1,
    "test_flow_task_arguments_prefect": 1,
    "test_workload_exit": 0,
    "test_cli_exit_codes_network": 0,
}
