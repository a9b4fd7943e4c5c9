"""Make traces/resnet50-h200-ddp1-kineto.json.gz: a PyTorch profiler (Kineto) trace of ResNet-50 (torchvision,
batch 32, float32, SGD momentum) trained with DDP over NCCL on one GPU (one rank), for `simfog import kineto`.

First 15 steps without the profiler, each timed on the host between two device synchronisations (printed: the
step as it runs unprofiled), then 10 steps under torch.profiler with record_shapes and with_modules
(schedule: 3 wait, 3 warm-up, 4 active ProfilerSteps). Needs a CUDA GPU, torch and torchvision.

    python traces/profile_ddp_kineto.py traces/resnet50-h200-ddp1-kineto.json.gz
"""

import gzip
import os
import shutil
import sys
import time

import torch
import torch.distributed as dist
import torchvision
from torch.profiler import ProfilerActivity, profile, schedule

out = sys.argv[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
torch.manual_seed(0)
model = torchvision.models.resnet50().cuda()
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(32, 3, 224, 224, device="cuda"), torch.randint(0, 1000, (32,), device="cuda")
loss_fn = torch.nn.CrossEntropyLoss()
plain = []
for _ in range(15):
    torch.cuda.synchronize()
    t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss_fn(ddp(x), y).backward()
    opt.step()
    torch.cuda.synchronize()
    plain.append(time.perf_counter() - t)
print("plain steps ms (last 10):", [round(v * 1e3, 2) for v in plain[5:]])
raw = out + ".json"
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], schedule=schedule(wait=3, warmup=3, active=4),
             record_shapes=True, with_modules=True, on_trace_ready=lambda p: p.export_chrome_trace(raw)) as prof:
    for _ in range(10):
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(x), y).backward()
        opt.step()
        prof.step()
torch.cuda.synchronize()
dist.destroy_process_group()
with open(raw, "rb") as f, gzip.open(out, "wb", compresslevel=9) as g:
    shutil.copyfileobj(f, g)
os.remove(raw)
print("wrote", out, os.path.getsize(out), "bytes")
