import torch, sys
torch.manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
def run(dtype, init, data, opt):
    fc1 = torch.nn.Linear(6, 5).to(dtype); bn = torch.nn.BatchNorm1d(5, eps=1e-5).to(dtype); fc2 = torch.nn.Linear(5, 3).to(dtype)
    ps = [fc1.weight, fc1.bias, bn.weight, bn.bias, fc2.weight, fc2.bias]
    with torch.no_grad():
        for p, v in zip(ps, init): p.copy_(v.to(dtype))
    o = (torch.optim.Adam if opt == 'adam' else torch.optim.AdamW)(ps, lr=1e-2, weight_decay=0 if opt == 'adam' else 1e-2)
    for x, y in data:
        o.zero_grad()
        loss = torch.nn.functional.cross_entropy(fc2(bn(fc1(x.to(dtype)))), y)
        loss.backward(); o.step()
    return [p.detach().double() for p in ps]
worst = {}
for opt in ['adam', 'adamw']:
  for N in range(3, 14):
    for xoff in [0.0, 8.0, 24.0]:
        init = [torch.empty(5, 6).uniform_(-1, 1), torch.empty(5).uniform_(-1, 1), torch.empty(5).uniform_(0.5, 2.5),
                torch.empty(5).uniform_(-1, 1), torch.empty(3, 5).uniform_(-1, 1), torch.empty(3).uniform_(-1, 1)]
        data = [(torch.empty(N, 6).uniform_(-2, 2) + xoff, torch.randint(0, 3, (N,))) for _ in range(2)]
        a = run(torch.float64, init, data, opt); b = run(torch.float32, init, data, opt)
        for k in range(6):
            d = (a[k] - init[k].double()).abs().max().item()
            e = (b[k] - a[k]).abs().max().item()
            worst.setdefault((opt, k), []).append(e / d if d > 0 else 0)
for (opt, k), v in sorted(worst.items()):
    v.sort(); print(opt, ['fc1.w', 'fc1.b', 'bn.g', 'bn.b', 'fc2.w', 'fc2.b'][k], 'median %.2e max %.2e' % (v[len(v)//2], v[-1]))
