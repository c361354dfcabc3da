"""Stand-in of ``hyper_parallel/custom_ops/experimental`` (NPU kernels of DeepSeek-V4's attention)."""

from hyper_parallel._standin import refused_function

SOURCE = "hyper_parallel/custom_ops/experimental"

npu_dense_lightning_indexer_grad_kl_loss = refused_function("npu_dense_lightning_indexer_grad_kl_loss", SOURCE)
npu_dense_lightning_indexer_softmax_lse = refused_function("npu_dense_lightning_indexer_softmax_lse", SOURCE)
npu_lightning_indexer = refused_function("npu_lightning_indexer", SOURCE)
npu_mhc_post = refused_function("npu_mhc_post", SOURCE)
npu_mhc_pre_sinkhorn = refused_function("npu_mhc_pre_sinkhorn", SOURCE)
npu_sparse_flash_mla = refused_function("npu_sparse_flash_mla", SOURCE)
npu_sparse_flash_mla_grad = refused_function("npu_sparse_flash_mla_grad", SOURCE)
npu_sparse_lightning_indexer_grad_kl_loss = refused_function("npu_sparse_lightning_indexer_grad_kl_loss", SOURCE)
npu_sparse_lightning_indexer_kl_loss_grad = refused_function("npu_sparse_lightning_indexer_kl_loss_grad", SOURCE)
