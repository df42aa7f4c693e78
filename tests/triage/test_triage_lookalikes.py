"""Lines that look like a failure of one kind and are another, or none: the broad rules' edges.

Each row is a real-shaped line that a rule's wording nearly matches: a healthy run's first loss
scale overflows, a pod's spec listing its default tolerations, a per-minute API quota, a Go
client's own deadline. The expected category is what the taxonomy says; ``None`` means the line
alone names no failure, so an exit code of 1 leaves the attempt unknown.
"""

from __future__ import annotations

import pytest

from trainguard.core import triage
from trainguard.core.taxonomy import Category

CASES = [
    # (id, log, exit code, expected category or None for the unknown fallback)
    ("a_first_loss_scale_overflow_is_routine",
     "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0", 1, None),
    ("deepspeed_halving_from_65536_is_routine",
     "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
     1, None),
    ("a_loss_scale_below_one_is_divergence",
     "| WARNING: overflow detected, setting loss scale to: 0.0001220703125", 1,
     Category.DIVERGENCE),
    ("deepspeed_at_its_floor_is_divergence",
     "[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 1", 1,
     Category.DIVERGENCE),
    ("a_pods_default_tolerations_are_spec",
     "Tolerations:     node.kubernetes.io/not-ready:NoExecute op=Exists for 300s\n"
     "                 node.kubernetes.io/unreachable:NoExecute op=Exists for 300s\n"
     "  Warning  FailedScheduling  2m  default-scheduler  0/3 nodes are available: "
     "3 Insufficient cpu.", None, Category.UNSCHEDULABLE),
    ("a_nodes_own_unreachable_taint_is_a_lost_node",
     "Taints:             node.kubernetes.io/unreachable:NoExecute", None,
     Category.NODE_FAILURE),
    ("docker_saying_oomkilled_false_is_no_memory_evidence",
     '        "OOMKilled": false,\n        "ExitCode": 137,', 137, Category.UNKNOWN),
    ("a_retried_read_timeout_warning_is_no_timeout",
     "WARNING:urllib3.connectionpool:Retrying (Retry(total=4)) after connection broken by "
     "'ReadTimeoutError(\"HTTPSConnectionPool(host='s3.amazonaws.com', port=443): Read timed "
     "out.\")': /bucket/shard-7.tar", 1, None),
    ("a_per_minute_api_quota_is_throttling",
     "google.api_core.exceptions.TooManyRequests: 429 Quota exceeded for quota metric 'Read "
     "requests' and limit 'Read requests per minute' of service 'storage.googleapis.com'", 1,
     Category.TRANSIENT_IO),
    ("a_disk_quota_is_the_filesystem",
     "OSError: [Errno 122] Disk quota exceeded: '/home/u/ckpt/step_400.pt'", 1,
     Category.CONFIG_ERROR),
    ("a_named_compute_quota_is_unschedulable",
     "Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. Limit: 0 "
     "in region us-east5.", 1, Category.UNSCHEDULABLE),
    ("a_go_clients_deadline_is_a_request_timing_out",
     "Error from server (InternalError): Internal error occurred: failed calling webhook "
     "\"validator.trainingoperator.kubeflow.org\": rpc error: code = DeadlineExceeded desc = "
     "context deadline exceeded", None, Category.TRANSIENT_IO),
    ("a_launchers_non_zero_exit_is_not_a_bug",
     "RuntimeError: Step 1 exited with non-zero status 1", 1, None),
    ("tensorflows_allocator_warning_is_not_a_failure",
     "2018-05-10 09:14:16.536752: W tensorflow/core/common_runtime/bfc_allocator.cc:217] Allocator "
     "(GPU_0_bfc) ran out of memory trying to allocate 84.60MiB. The caller indicates that this is not "
     "a failure, but may mean that there could be performance gains if more memory is available.", 1, None),
    ("a_tensorflow_op_out_of_device_memory_is_logged_as_a_warning",
     "2018-08-06 08:21:31.998655: W tensorflow/core/framework/op_kernel.cc:1318] OP_REQUIRES failed at "
     "conv_ops.cc:72 : Resource exhausted: OOM when allocating tensor with shape[5,32,512,1024] and type "
     "float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc", 1, Category.CUDA_OOM),
    ("a_sockets_enotconn_thrown_from_cpp_is_no_network_mount",
     "terminate called after throwing an instance of 'std::system_error'\n"
     "  what():  Transport endpoint is not connected", 1, Category.NATIVE_CRASH),
    ("a_users_qdel_is_a_cancel",
     "05/01/2024 10:00:00;0008;PBS_Server.1;Job;123.server;Job deleted at request of alice@login1", None,
     Category.USER_CANCELLED),
    ("a_job_taken_off_a_failed_node_is_the_node",
     "Job deleted at request of root@head1\njob preempted (node failure)", None, Category.NODE_FAILURE),
    ("a_tensorflow_data_loss_names_its_task_then_says_what",
     "tensorflow.python.framework.errors_impl.DataLossError: From /job:worker/replica:0/task:1:\n"
     "corrupted record at 12", 1, Category.DATA_ERROR),
    ("mpi_losing_the_daemon_of_a_node_whose_job_the_oom_killer_ended_is_memory",
     "Memory cgroup out of memory: Killed process 123 (python)\n"
     "ORTE has lost communication with its daemon located on node:\n  hostname:  node7", 1, Category.HOST_OOM),
    ("mpi_losing_a_daemon_alone_is_the_node",
     "ORTE has lost communication with a remote daemon.\n  Remote daemon: [[43015,0],20] on node worker-19", 1,
     Category.NODE_FAILURE),
    ("a_registry_answering_503_to_pyxis_is_passing",
     "slurmstepd: error: pyxis: failed to import docker image\n"
     "slurmstepd: error: pyxis:     [ERROR] URL https://nvcr.io/v2/nvidia/pytorch/manifests/24.01-py3 returned "
     "error code: 503 Service Unavailable\nslurmstepd: error: pyxis: couldn't start container", 1,
     Category.TRANSIENT_IO),
    ("a_remote_shell_without_the_mpi_daemon_is_configuration",
     "bash: /opt/ompi/bin/orted: No such file or directory", 1, Category.CONFIG_ERROR),
    ("an_rdma_queue_pair_timing_out_is_the_fabric",
     "Failed to modify QP to RTR: Connection timed out\nerrno: 110", 1, Category.NCCL_ERROR),
    ("a_hub_connection_timing_out_stays_passing",
     "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='huggingface.co', port=443): Max retries "
     "exceeded with url: /api/models (Caused by ConnectTimeoutError(<urllib3.connection.HTTPSConnection "
     "object>, 'Connection to huggingface.co timed out. (connect timeout=10)'))", 1, Category.TRANSIENT_IO),
    ("an_mpi_completion_queue_eio_is_the_fabric_not_a_mount",
     "MPIDI_OFI_handle_cq_error(1075): OFI poll failed (ofi_events.c:1077:MPIDI_OFI_handle_cq_error:"
     "Input/output error - PTLTE_NOT_FOUND)", 1, Category.NCCL_ERROR),
    ("an_htcondor_eviction_is_a_preemption",
     "004 (123.000.000) 03/09 02:52:07 Job was evicted.\n\t(0) Job was not checkpointed.", None,
     Category.PREEMPTED),
    ("an_amd_gpus_page_fault_is_the_device_not_a_bare_abort",
     "Memory access fault by GPU node-1 (Agent handle: 0x5d8d620) on address 0x7f81. Reason: Page not present "
     "or supervisor privilege.\nAborted (core dumped)", 134, Category.GPU_FAULT),
    ("a_rocm_build_without_code_for_this_gpu_is_configuration",
     '"hipErrorNoBinaryForGpu: Unable to find code object for all current devices!"\nAborted (core dumped)', 134,
     Category.CONFIG_ERROR),
    ("a_save_onto_a_full_disk_leaves_no_corrupt_checkpoint",
     "safetensors_rust.SafetensorError: Error while serializing: I/O error: No space left on device (os error 28)",
     1, Category.CONFIG_ERROR),
    ("a_truncated_hdf5_file_outside_model_loading_is_data",
     "OSError: Unable to open file (truncated file: eof = 10485760, sblock->base_addr = 0, stored_eof = 372841106)",
     1, Category.DATA_ERROR),
    ("a_truncated_hdf5_file_while_weights_load_is_the_checkpoint",
     "    model.load_weights('weights.h5')\nOSError: Unable to open file (truncated file: eof = 10485760, "
     "sblock->base_addr = 0, stored_eof = 372841106)", 1, Category.CHECKPOINT_CORRUPTED),
    ("an_assertion_that_the_gpu_lacks_a_capability_is_configuration_not_a_bug",
     "    assert fp8_available, reason_for_no_fp8\nAssertionError: Device compute capability 8.9 or higher "
     "required for FP8 execution.", 1, Category.CONFIG_ERROR),
    ("yarn_killing_a_container_over_its_memory_is_host_memory",
     "ERROR YarnClusterScheduler: Lost executor 6 on host7: Container killed by YARN for exceeding memory limits. "
     "8.2 GB of 8 GB physical memory used.", 1, Category.HOST_OOM),
    ("a_restored_tensor_failing_its_checksum_is_the_checkpoint_even_as_a_warning",
     "2018-01-23 20:01:48.192712: W tensorflow/core/framework/op_kernel.cc:1192] Data loss: Checksum does not "
     "match: stored 411918014 vs. calculated on the restored bytes 2088034305", 1, Category.CHECKPOINT_CORRUPTED),
    ("an_xpu_out_of_device_memory_is_memory_though_the_process_aborts",
     "terminate called after throwing an instance of 'sycl::_V1::exception'\n  what():  Enqueue process failed.\n"
     "level_zero backend failed with error: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)\nFatal Python error: Aborted",
     134, Category.CUDA_OOM),
    ("a_collective_that_cannot_load_nccl_is_the_environment",
     "NCCL operation ncclGetUniqueId(&id) failed: Unable to load NCCL library. Multi-GPU collectives will not "
     "work.", 1, Category.CONFIG_ERROR),
    ("a_config_entry_without_a_type_is_configuration_not_a_bug",
     "  File \"mmcv/utils/registry.py\", line 144, in build_from_cfg\nKeyError: '`cfg` or `default_args` must "
     "contain the key \"type\", but got {'num_classes': 1}'", 1, Category.CONFIG_ERROR),
    ("a_type_the_registry_lacks_is_configuration",
     "KeyError: 'RTMDetHead2 is not in the mmdet::model registry. Please check whether the value of `RTMDetHead2` "
     "is correct or it was registered as expected.'", 1, Category.CONFIG_ERROR),
    ("a_missing_dict_key_in_code_is_still_a_bug",
     "  File \"train.py\", line 40, in build\n    head = cfg['type']\nKeyError: 'type'", 1, Category.CODE_ERROR),
    ("a_loader_with_no_valid_record_is_the_data_though_an_assertion",
     '    assert len(dataset_dicts), "No valid data found in {}.".format(",".join(names))\n'
     "AssertionError: No valid data found in coco_2017_train.", 1, Category.DATA_ERROR),
    ("a_weights_check_finding_nan_is_divergence_even_as_a_warning",
     "2023-06-14 13:04:41,744 - speechbrain.core - WARNING - Parameter is not finite: Parameter containing:\n"
     "tensor([nan, nan, nan,  ..., nan, nan, nan], device='cuda:0', requires_grad=True)", 1, Category.DIVERGENCE),
    ("mpirun_taking_a_script_for_its_executable_is_configuration",
     "mpirun was unable to find the specified executable file, and therefore\ndid not launch the job.  This error "
     "was first reported for process\nrank 0; it may have occurred for other processes as well.", 1,
     Category.CONFIG_ERROR),
    ("ssh_refusing_the_launchers_login_is_configuration",
     "root@trainer-worker-0.trainer-worker: Permission denied (publickey,password).", 255, Category.CONFIG_ERROR),
    ("a_host_given_with_its_slots_to_ssh_is_configuration",
     "ssh: Could not resolve hostname localhost:4: Name or service not known", 255, Category.CONFIG_ERROR),
    ("a_worker_name_that_does_not_resolve_yet_is_transient",
     "ssh: Could not resolve hostname trainer-worker-1.trainer-worker: Name or service not known", 255,
     Category.TRANSIENT_IO),
    ("glooks_store_waiting_in_vain_for_its_peers_is_the_collectives",
     "terminate called after throwing an instance of 'gloo::IoException'\n  what():  "
     "[horovod/common/gloo/http_store.cc:53] Wait timeout for key(s): 0\n*** Received signal 6 ***", 134,
     Category.NCCL_ERROR),
    ("mpich_printing_its_usage_for_an_open_mpi_option_is_configuration",
     "Usage: ./mpiexec [global opts] [local opts for exec1] [exec1] [exec1 args] : [local opts for exec2] ...\n\n"
     "Global options (passed to all executables):", 255, Category.CONFIG_ERROR),
    ("a_vocabulary_the_tensor_parallel_ranks_do_not_divide_is_configuration",
     "    ensure_divisibility(numerator, denominator)\n  File \"megatron/core/utils.py\", line 24, in "
     "ensure_divisibility\nAssertionError: 151851 is not divisible by 4", 1, Category.CONFIG_ERROR),
    ("heads_the_tensor_parallel_ranks_do_not_divide_is_configuration",
     "AssertionError: num_attention_heads (14) must be divisible by tensor_model_parallel_size (4)", 1,
     Category.CONFIG_ERROR),
    ("a_programs_own_divisibility_assertion_is_still_a_bug",
     "    assert len(batch) % 3 == 0, 'len(batch) is not divisible by 3'\nAssertionError: len(batch) is not "
     "divisible by 3", 1, Category.CODE_ERROR),
    ("a_tar_shard_cut_short_is_the_data",
     "tarfile.ReadError: (\"unexpected end of data @ <_io.BufferedReader name='train/00000022.tar'>\", "
     "{'__url__': 'train/00000022.tar'})", 1, Category.DATA_ERROR),
    ("nvjpeg_on_a_bad_jpeg_is_the_data",
     "RuntimeError: Critical error in pipeline: Error in thread 0: [/opt/dali/dali/pipeline/operators/decoder/"
     "nvjpeg_decoder.h:331] NVJPEG error \"3\"\nCurrent pipeline object is no longer valid.", 1, Category.DATA_ERROR),
    ("nvjpeg_failing_for_another_reason_names_no_data",
     "Critical error in pipeline: Error in thread 0: [/opt/dali/dali/pipeline/operators/decoder/"
     "nvjpeg_decoder.h:331] NVJPEG error \"6\"\nCurrent pipeline object is no longer valid.", 1, None),
    ("a_librarys_check_of_an_installed_version_is_configuration",
     "ImportError: transformers>=4.41.2,<=4.48.1 is required for a normal functioning of this module, but found "
     "transformers==4.49.0.dev0.", 1, Category.CONFIG_ERROR),
    ("a_name_the_code_imports_and_the_library_lacks_is_still_a_bug",
     "ImportError: cannot import name 'LlamaFlashAttention2' from 'transformers.models.llama.modeling_llama'", 1,
     Category.CODE_ERROR),
    ("a_loader_finding_no_valid_sample_is_the_data",
     "RuntimeError: Cannot find valid samples, check `data/README.md` for the data format.", 1, Category.DATA_ERROR),
    ("no_valid_checkpoint_is_not_the_data",
     "ValueError: found no valid checkpoint in /ckpt/run-3", 1, Category.CODE_ERROR),
    ("nccls_warning_of_two_ranks_on_one_gpu_is_configuration",
     "host:591:599 [0] init.cc:795 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 31000\n"
     "host:591:599 [0] NCCL INFO init.cc:1358 -> 5", None, Category.CONFIG_ERROR),
    ("nccls_warning_of_a_refused_connection_is_still_the_collectives",
     "host:591:599 [0] misc/socket.cc:484 NCCL WARN Net : Connect to 10.0.0.2<43817> failed : Connection refused\n"
     "host:591:599 [0] NCCL INFO transport/net_socket.cc:334 -> 6", None, Category.NCCL_ERROR),
    ("a_librarys_missing_optional_backend_is_configuration",
     "ValueError: PEFT backend is required for this method.", 1, Category.CONFIG_ERROR),
    ("pickle_refusing_what_the_code_hands_a_worker_is_a_bug",
     "Error running job: cannot pickle 'weakref.ReferenceType' object", 1, Category.CODE_ERROR),
    ("a_trainer_finding_no_images_in_its_folder_is_the_data",
     "No data found. Please verify arguments (train_data_dir must be the parent of folders with images)", 1,
     Category.DATA_ERROR),
    ("no_data_in_a_cache_is_no_missing_dataset",
     "No data found in cache for shard 3, computing features\nTraceback (most recent call last):\nKeyError: 'label'",
     1, Category.CODE_ERROR),
    ("a_batch_skipped_for_no_valid_sample_is_no_missing_dataset",
     "skipping batch 12: no valid samples in this batch\nTraceback (most recent call last):\nKeyError: 'label'", 1,
     Category.CODE_ERROR),
    ("hydra_without_its_primary_config_is_configuration",
     "Cannot find primary config 'train'. Check that it's in your config search path.", 1, Category.CONFIG_ERROR),
    ("a_numpy_alias_removed_under_older_code_is_the_environment",
     "AttributeError: module 'numpy' has no attribute 'int'.\n`np.int` was a deprecated alias for the builtin `int`.",
     1, Category.CONFIG_ERROR),
    ("a_numpy_name_the_code_mistyped_is_a_bug",
     "AttributeError: module 'numpy' has no attribute 'arrray'", 1, Category.CODE_ERROR),
    ("a_framework_naming_the_nccl_call_that_failed_is_the_collectives",
     "RuntimeError: Runtime error: unhandled system error\n        ncclGroupEnd() at ResourceManagerCore("
     "/hugectr/src/resource_manager_core.cpp:176)", 1, Category.NCCL_ERROR),
    ("a_reader_refusing_a_data_files_header_is_the_data",
     "[HCDEBUG][ERROR] DataHeaderError /hugectr/HugeCTR/include/data_readers/data_reader_worker.hpp:58", 1,
     Category.DATA_ERROR),
    ("killed_beside_its_own_report_of_memory_full_is_the_oom_killer",
     "134 Killed                  | python3 train.py\nMemory usage percent: 99.60%", None, Category.HOST_OOM),
    ("killed_with_memory_to_spare_is_no_evidence_of_memory",
     "134 Killed                  | python3 train.py\nMemory usage percent: 45.10%", None, Category.UNKNOWN),
    ("memory_nearly_full_without_a_kill_names_no_failure",
     "Memory usage percent: 99.60%\nepoch 3 done", 1, None),
    ("a_policy_whose_std_went_nan_is_divergence",
     "RuntimeError: normal expects all elements of std >= 0.0", 1, Category.DIVERGENCE),
    ("a_nan_check_refusing_the_policys_actions_is_divergence",
     "ValueError: found nan in actions.", 1, Category.DIVERGENCE),
    ("a_nan_check_refusing_the_environments_observations_is_not",
     "ValueError: found nan in observations.", 1, Category.CODE_ERROR),
    ("gpu_physx_refusing_device_memory_is_cuda_oom",
     "PxgCudaDeviceMemoryAllocator fail to allocate memory 339738624 bytes!! Result = 2", 1, Category.CUDA_OOM),
    ("rays_memory_monitor_is_host_oom",
     "ray.exceptions.RayTaskError(RayOutOfMemoryError): ray::IMPALA.train() (pid=19168, ip=172.31.26.49)", 1,
     Category.HOST_OOM),
    ("a_checkpoint_naming_a_class_the_library_dropped_is_the_environment",
     "AttributeError: Can't get attribute 'SingleAgentRLModuleSpec' on <module 'ray.rllib.core.rl_module.rl_module' "
     "from '/env/ray/rllib/core/rl_module/rl_module.py'>", 1, Category.CONFIG_ERROR),
    ("a_checkpoint_naming_a_class_the_script_lacks_is_a_bug",
     "AttributeError: Can't get attribute 'Net' on <module '__main__' from 'train.py'>", 1, Category.CODE_ERROR),
    ("the_interpreter_aborting_on_its_own_fatal_error_is_a_native_crash",
     "Fatal Python error: none_dealloc: deallocating None\nPython runtime state: initialized", 1,
     Category.NATIVE_CRASH),
    ("a_step_skipped_for_overflow_now_and_then_is_routine",
     "Skipped 1 iterations due to Overflow; loss scale now 32768", 1, None),
    ("an_overflow_monitor_giving_up_is_divergence",
     "Exception: Skipped 50 iterations in a row due to Overflow - Exiting training.", 1, Category.DIVERGENCE),
    ("an_optimizer_clipping_its_gradients_by_half_is_routine",
     "WARNING [optim.py:385] Scaling gradients by 0.4173, model_norm_threshold=911.53", 1, None),
    ("an_optimizer_scaling_nan_gradients_to_zero_is_divergence",
     "WARNING [optim.py:385] Scaling gradients by 0.0, model_norm_threshold=911.5296020507812", 1,
     Category.DIVERGENCE),
    ("bf16_code_for_a_gpu_before_ampere_is_the_environment",
     "ptxas /tmp/tmpssw0idjk.ptx, line 90; error   : Feature '.bf16' requires .target sm_80 or higher", 1,
     Category.CONFIG_ERROR),
    ("a_tpu_kernel_refusing_a_data_type_its_units_lack_is_the_environment",
     "jaxlib.xla_extension.XlaRuntimeError: INVALID_ARGUMENT: Failed to compile a Mosaic module: 'tpu.matmul' op "
     "Unsupported input data type in matrix multiplication.", 1, Category.CONFIG_ERROR),
    ("a_tpu_kernel_that_fails_to_compile_for_its_own_shapes_is_a_bug",
     "jaxlib.xla_extension.XlaRuntimeError: INVALID_ARGUMENT: Failed to compile a Mosaic module: 'vector.broadcast' "
     "op Not implemented", 1, Category.CODE_ERROR),
    ("nccls_socket_refused_between_nodes_is_a_collectives_failure",
     "node2: Net : Call to recv from 10.0.0.2<56843> failed : Connection refused", 1, Category.NCCL_ERROR),
    ("a_refused_connection_to_a_web_service_stays_a_network_hiccup",
     "WARNING: Call to recv from api.example.com failed : Connection refused", 1, Category.TRANSIENT_IO),
    ("skypilots_node_prefix_hides_no_exception",
     "(head, rank=0, pid=4773) AssertionError", 1, Category.CODE_ERROR),
    ("a_c_assert_aborting_the_process_is_a_native_crash",
     "python: ../src/sampler.c:212: draw: Assertion `n > 0' failed.", 1, Category.NATIVE_CRASH),
    ("a_metal_kernels_failed_assertion_is_a_native_crash",
     "/AppleInternal/Library/BuildRoots/91a3/MPSNDArray/Kernels/MPSNDArrayGatherND.mm:256: failed assertion "
     "`Rank of updates array (1) must be greater than or equal to inner-most dimension of indices array (300)'", 1,
     Category.NATIVE_CRASH),
    ("a_cuda_kernels_assertion_stays_the_device_side_assert",
     "/pytorch/aten/src/ATen/native/cuda/Loss.cu:242: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], "
     "thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed.", 1, Category.CODE_ERROR),
    ("a_program_missing_from_path_is_the_environment",
     '  File "/usr/lib/python3.10/subprocess.py", line 1863, in _execute_child\n'
     "    raise child_exception_type(errno_num, err_msg, err_filename)\n"
     "FileNotFoundError: [Errno 2] No such file or directory: 'git'", 1, Category.CONFIG_ERROR),
    ("a_dataset_file_missing_stays_data",
     '  File "/app/train.py", line 40, in load\n    with open(path) as f:\n'
     "FileNotFoundError: [Errno 2] No such file or directory: '/data/train.jsonl'", 1, Category.DATA_ERROR),
    ("a_script_refusing_the_mode_it_was_launched_in_is_the_configuration",
     "NotImplementedError: Only DistributedDataParallel is supported.", 1, Category.CONFIG_ERROR),
    ("an_operator_missing_on_the_mps_device_is_the_configuration",
     "NotImplementedError: The operator 'aten::_linalg_solve_ex.result' is not currently implemented for the MPS "
     "device.", 1, Category.CONFIG_ERROR),
    ("an_abstract_method_left_unwritten_stays_a_bug",
     "NotImplementedError", 1, Category.CODE_ERROR),
    ("a_version_check_that_cannot_read_a_pre_release_is_a_bug",
     "ValueError: invalid literal for int() with base 10: '0a0'", 1, Category.CODE_ERROR),
    ("a_record_with_a_word_where_a_number_belongs_stays_data",
     "ValueError: invalid literal for int() with base 10: 'label'", 1, Category.DATA_ERROR),
    ("a_named_loss_term_gone_nan_is_divergence",
     "02:31:56: train iter: 100 loss_net: nan loss_scale: 785.4200 norm: nan", 1, Category.DIVERGENCE),
    ("the_loss_scalers_own_value_is_no_loss",
     "step 10 loss_scale: inf", 1, None),
    ("spawn_reimporting_a_script_without_its_main_guard_is_a_bug",
     "        An attempt has been made to start a new process before the\n"
     "        current process has finished its bootstrapping phase.", 1, Category.CODE_ERROR),
]


@pytest.mark.parametrize(("log", "exit_code", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_lookalike_line_gets_the_category_the_taxonomy_gives_it(
        log: str, exit_code: int | None, expected: Category | None) -> None:
    diagnosis = triage.classify(triage.Signals(exit_code=exit_code, log=log))
    assert diagnosis is not None
    if expected is None:
        assert diagnosis.rule_id == "fallback.unknown", diagnosis
    else:
        assert diagnosis.category is expected, diagnosis
