"""Stand-in of ``hyper_parallel/platform/mindspore/pipeline_parallel/_utils.py`` ``_MicroBatch``: a batch split
into ``micro_batch_num`` equal parts along each input's batch axis (0 unless given; -1: not split). The
original splits DTensors through ``custom_shard``; on one card the inputs are plain tensors."""

from mindspore import nn


class _MicroBatch(nn.Cell):
    def __init__(self, micro_batch_num, args_batch_dim=None, kwargs_batch_dim=None):
        super().__init__()
        self.micro_batch_num = micro_batch_num
        self.args_batch_dim = args_batch_dim
        self.kwargs_batch_dim = kwargs_batch_dim

    def _part(self, value, dim, index):
        if dim == -1:
            return value
        size = value.shape[dim] // self.micro_batch_num
        cut = [slice(None)] * value.ndim
        cut[dim] = slice(size * index, size * (index + 1))
        return value[tuple(cut)]

    @staticmethod
    def _dim(spec):
        return 0 if spec is None else spec.batch_dim

    def construct(self, args, kwargs):
        arg_dims = [self._dim(self.args_batch_dim[i] if self.args_batch_dim else None) for i in range(len(args))]
        kwarg_dims = {k: self._dim(self.kwargs_batch_dim[k] if self.kwargs_batch_dim else None) for k in kwargs}
        split_args = [[self._part(a, arg_dims[i], index) for i, a in enumerate(args)]
                      for index in range(self.micro_batch_num)]
        split_kwargs = [{k: self._part(v, kwarg_dims[k], index) for k, v in kwargs.items()}
                        for index in range(self.micro_batch_num)]
        return split_args, split_kwargs
