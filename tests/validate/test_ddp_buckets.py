"""simfog's "ddp" merge plan against the buckets real torch DDP builds (gloo, world size 1, CPU).

DDP rebuilds its buckets once, from the observed gradient-ready order, at the start of iteration 2; the sizes it
then uses are in `_get_ddp_logging_data()["rebuilt_bucket_sizes"]` and the parameters of each bucket in
"rebuilt_per_bucket_param_indices".
"""

from __future__ import annotations

import pytest

from simfog.merge import GradTensor, MergeSettings, plan

torch = pytest.importorskip("torch", reason="torch is needed to build real DDP buckets")
dist = pytest.importorskip("torch.distributed")
nn = torch.nn

MiB = 1 << 20

# Linear(in, out) in forward order: weight in*out*4 B, bias out*4 B (float32). Gradients become ready in reverse:
# 5.bias 256, 5.weight 65,536, 4.bias 1,024, 4.weight 2,097,152, 3.bias 8,192, 3.weight 16,777,216,
# 2.bias 8,192, 2.weight 8,388,608, 1.bias 4,096, 1.weight 4,194,304, 0.bias 4,096, 0.weight 2,097,152.
SHAPES = [(512, 1024), (1024, 1024), (1024, 2048), (2048, 2048), (2048, 256), (256, 64)]

EXPECTED = {
    # default: first bucket closes at >= 1 MiB: 256 + 65,536 + 1,024 + 2,097,152 = 2,163,968 (overshoot);
    # then >= 25 MiB (26,214,400): 8,192 + 16,777,216 + 8,192 + 8,388,608 + 4,096 + 4,194,304 = 29,380,608;
    # the rest: 4,096 + 2,097,152 = 2,101,248.
    None: [2_163_968, 29_380_608, 2_101_248],
    # bucket_cap_mb=5: every limit 5,242,880: 2,163,968 + 8,192 + 16,777,216 = 18,949,376;
    # 8,192 + 8,388,608 = 8,396,800; 4,096 + 4,194,304 + 4,096 + 2,097,152 = 6,299,648.
    5: [18_949_376, 8_396_800, 6_299_648],
    # bucket_cap_mb=25 given explicitly: no 1 MiB first bucket: 2,163,968 + 16,785,408 + 8,396,800 = 27,346,176;
    # the rest 6,299,648.
    25: [27_346_176, 6_299_648],
}


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    store = dist.FileStore(str(tmp_path_factory.mktemp("ddp") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _train(model, make_input, bucket_cap_mb):
    """Wrap in DDP, run 3 iterations; returns (ready order of parameter names, DDP's rebuilt buckets as lists
    of parameter names, their sizes in bytes)."""
    names = {p: n for n, p in model.named_parameters()}
    index = [n for n, _ in model.named_parameters()]
    order: list[str] = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: order.append(names[p]))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    for _ in range(3):
        order.clear()
        opt.zero_grad()
        ddp(make_input()).sum().backward()
        opt.step()
    data = ddp._get_ddp_logging_data()
    assert data.get("has_rebuilt_buckets") == 1
    sizes = [int(s) for s in data["rebuilt_bucket_sizes"].split(",")]
    buckets = [[index[int(i)] for i in b.split()] for b in data["rebuilt_per_bucket_param_indices"].split(",")]
    return list(order), buckets, sizes


def _simfog(model, order, cap_mb):
    params = dict(model.named_parameters())
    ts = [GradTensor(n, params[n].numel() * params[n].element_size(), 1e-3 * k,
                     str(params[n].dtype).removeprefix("torch.")) for k, n in enumerate(order)]
    settings = MergeSettings(threshold_bytes=None if cap_mb is None else cap_mb * MiB)
    return plan("ddp", ts, settings)


@pytest.mark.parametrize("cap_mb", [None, 5, 25])
def test_ddp_rebuilt_buckets_match_simfog(process_group, cap_mb):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(i, o) for i, o in SHAPES])
    order, ddp_buckets, ddp_sizes = _train(model, lambda: torch.randn(2, SHAPES[0][0]), cap_mb)
    assert order == [f"{k}.{w}" for k in range(5, -1, -1) for w in ("bias", "weight")]
    assert ddp_sizes == EXPECTED[cap_mb]
    ours = _simfog(model, order, cap_mb)
    assert [b.nbytes for b in ours] == ddp_sizes
    assert [list(b.tensors) for b in ours] == ddp_buckets


class _TwoDtypes(nn.Module):
    """A float32 and a float64 branch: DDP buckets each dtype separately, each with its own 1 MiB first bucket."""

    def __init__(self):
        super().__init__()
        self.a, self.c = nn.Linear(256, 512), nn.Linear(512, 64)
        self.b, self.d = nn.Linear(256, 640).double(), nn.Linear(640, 64).double()

    def forward(self, x):
        return self.c(self.a(x)).sum() + self.d(self.b(x.double())).sum()


def test_ddp_buckets_per_dtype_match_simfog(process_group):
    torch.manual_seed(0)
    model = _TwoDtypes()
    order, ddp_buckets, ddp_sizes = _train(model, lambda: torch.randn(2, 256), None)
    ours = _simfog(model, order, None)
    # float64 in ready order: d.bias 512 + d.weight 327,680 + b.bias 5,120 + b.weight 1,310,720 = 1,644,032
    # >= 1 MiB closes it; the float32 ones (256 + 131,072 + 2,048 + 524,288 = 657,664) stay open and come last.
    assert ddp_sizes == [1_644_032, 657_664]
    assert [b.nbytes for b in ours] == ddp_sizes
    assert [list(b.tensors) for b in ours] == ddp_buckets
