"""PyTorch twins of the shipped models (models/*.cfg), for the ONNX tests.

The layer names follow the model files, so a clgrad export's initializers
("<layer>.weight", ...) load into these modules by name (load_clgrad)."""
import torch
import torch.nn as nn


class Norm(nn.Module):
    """(x - mean) / std per channel: the input normalization."""

    def __init__(self, mean, std):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x):
        return (x - self.mean) / self.std


class LeNet5(nn.Module):
    def __init__(self, softmax=True, norm=None, act=nn.ReLU):
        super().__init__()
        self.norm = Norm(*norm) if norm else nn.Identity()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.pool2 = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)
        self.act = act()
        self.softmax = softmax

    def forward(self, x):
        x = self.norm(x)
        x = self.pool1(self.act(self.conv1(x)))
        x = self.pool2(self.act(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        x = self.fc3(x)
        return torch.softmax(x, 1) if self.softmax else x


class VGGS(nn.Module):
    def __init__(self, softmax=True, norm=None):
        super().__init__()
        self.norm = Norm(*norm) if norm else nn.Identity()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
        self.pool1 = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv4 = nn.Conv2d(64, 64, 3, padding=1)
        self.pool2 = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(64 * 7 * 7, 256)
        self.drop1 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(256, 10)
        self.softmax = softmax

    def forward(self, x):
        r = torch.relu
        x = self.norm(x)
        x = self.pool1(r(self.conv2(r(self.conv1(x)))))
        x = self.pool2(r(self.conv4(r(self.conv3(x)))))
        x = self.drop1(r(self.fc1(torch.flatten(x, 1))))
        x = self.fc2(x)
        return torch.softmax(x, 1) if self.softmax else x


class ResNetMini(nn.Module):
    def __init__(self, softmax=True, norm=None):
        super().__init__()
        self.norm = Norm(*norm) if norm else nn.Identity()
        c = lambda i, o, s=1, k=3: nn.Conv2d(i, o, k, stride=s, padding=k // 2, bias=False)
        self.stem, self.stem_bn = c(1, 16), nn.BatchNorm2d(16)
        self.b1_conv1, self.b1_bn1 = c(16, 16), nn.BatchNorm2d(16)
        self.b1_conv2, self.b1_bn2 = c(16, 16), nn.BatchNorm2d(16)
        self.b2_conv1, self.b2_bn1 = c(16, 32, 2), nn.BatchNorm2d(32)
        self.b2_conv2, self.b2_bn2 = c(32, 32), nn.BatchNorm2d(32)
        self.b2_proj, self.b2_proj_bn = c(16, 32, 2, 1), nn.BatchNorm2d(32)
        self.b3_conv1, self.b3_bn1 = c(32, 32), nn.BatchNorm2d(32)
        self.b3_conv2, self.b3_bn2 = c(32, 32), nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, 10)
        self.softmax = softmax

    def forward(self, x):
        r = torch.relu
        x = self.norm(x)
        s = r(self.stem_bn(self.stem(x)))
        y = self.b1_bn2(self.b1_conv2(r(self.b1_bn1(self.b1_conv1(s)))))
        b1 = r(y + s)
        y = self.b2_bn2(self.b2_conv2(r(self.b2_bn1(self.b2_conv1(b1)))))
        b2 = r(y + self.b2_proj_bn(self.b2_proj(b1)))
        y = self.b3_bn2(self.b3_conv2(r(self.b3_bn1(self.b3_conv1(b2)))))
        b3 = r(y + b2)
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(b3, 1), 1)
        x = self.fc(x)
        return torch.softmax(x, 1) if self.softmax else x


class Branch(nn.Module):
    """Not a shipped model: a branching graph (Add, Concat, zero Pad into AveragePool, Tanh, a Linear
    without bias, global average pooling)."""

    def __init__(self, softmax=True, norm=None):
        super().__init__()
        self.norm = Norm(*norm) if norm else nn.Identity()
        self.a = nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.b = nn.Conv2d(1, 4, 1)
        self.ap = nn.AvgPool2d(2)
        self.f = nn.Linear(8, 10, bias=False)
        self.softmax = softmax

    def forward(self, x):
        x = self.norm(x)
        y = torch.relu(self.bn(self.a(x)) + self.b(x))
        z = torch.cat([y, torch.tanh(y)], 1)
        z = nn.functional.adaptive_avg_pool2d(self.ap(z), 1)
        x = self.f(torch.flatten(z, 1))
        return torch.softmax(x, 1) if self.softmax else x


MODELS = {"lenet5": LeNet5, "vgg-s": VGGS, "resnet-mini": ResNetMini}

# clgrad parameter names -> PyTorch state_dict suffixes
_PMAP = {"weight": "weight", "bias": "bias", "gamma": "weight", "beta": "bias",
         "running_mean": "running_mean", "running_var": "running_var"}


def randomize(model, gen):
    """Random weights, and random batch-norm statistics so they matter."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if name.endswith("bias") else
                                                            (2.0 / max(1, p[0].numel())) ** 0.5))
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)


def load_clgrad(model, inits):
    """Loads a clgrad export's initializers {"<layer>.<param>": array} by name."""
    sd = model.state_dict()
    n = 0
    for key, arr in inits.items():
        if "." not in key:
            continue
        layer, param = key.rsplit(".", 1)
        if param not in _PMAP or layer + "." + _PMAP[param] not in sd:
            continue
        sd[layer + "." + _PMAP[param]] = torch.from_numpy(arr.copy()).reshape(sd[layer + "." + _PMAP[param]].shape)
        n += 1
    model.load_state_dict(sd)
    if "norm.mean" in inits and isinstance(model.norm, Norm):
        model.norm.mean.copy_(torch.from_numpy(inits["norm.mean"].copy()).view(1, -1, 1, 1))
        model.norm.std.copy_(torch.from_numpy(inits["norm.std"].copy()).view(1, -1, 1, 1))
    return n
