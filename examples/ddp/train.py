"""Data-parallel training of a tiny model with PyTorch DistributedDataParallel, as a jobsite job.

Submit it with `replicas: 2` (or more). jobsite gives every replica RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT, so it runs as the command itself:     python train.py
and, as torchrun reads the PET_* variables jobsite sets too, under torchrun:
    torchrun --nnodes=$WORLD_SIZE --node_rank=$NODE_RANK train.py
Each rank trains on its own random data; DDP averages the gradients, so every rank ends with the same
weights and prints the same digest of them.
"""

import hashlib
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STEPS = 20


def main() -> None:
    cuda = torch.cuda.is_available()
    # env:// (the default) reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1 + rank)  # but each rank its own data
    for _ in range(STEPS):
        x = torch.randn(32, 8, generator=data)
        y = x.sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()  # the gradients are averaged over all ranks here
        optimizer.step()

    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    digest = hashlib.sha256(bytes(weights.view(torch.uint8).tolist())).hexdigest()
    print(f"rank {rank}/{world_size} loss {loss.item():.4f} params sha256 {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
