"""GPT-2's MLP activation (`activation_function`) as ONNX ops, one entry per name in transformers' ACT2FN.

Each builder takes the MLP's first product and its bias and returns act(product + bias) [B, T, inner]; the
formulas are transformers' (transformers/activations.py), written with the same constants so the float32
graph stays within the export's 1e-5 parity gate. Activations with weights of their own (prelu, xielu) read
them from the checkpoint under `transformer.h.{i}.mlp.act.*`.
"""

import math

import numpy as np

from ...errors import ExportError
from ...graph.builder import MS_DOMAIN

TANH_GELU = ("gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_accurate")  # one formula
ERF_GELU = ("gelu", "gelu_python")


def _add(g, x, bias):
    return g.op("Add", [x, bias])


def _f(g, value):
    return g.const(value, np.float32)


def _tanh_gelu(g, x, bias, weights, prefix):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), with the bias add, in one op."""
    return g.op("FastGelu", [x, bias], domain=MS_DOMAIN)


def _erf_gelu(g, x, bias, weights, prefix):
    """0.5 x (1 + erf(x / sqrt 2)), with the bias add, in one op."""
    return g.op("BiasGelu", [x, bias], domain=MS_DOMAIN)


def _gelu_10(g, x, bias, weights, prefix):
    return g.op("Clip", [_erf_gelu(g, x, bias, weights, prefix), _f(g, -10.0), _f(g, 10.0)])


def _quick_gelu(g, x, bias, weights, prefix):
    y = _add(g, x, bias)
    return g.op("Mul", [y, g.op("Sigmoid", [g.op("Mul", [y, _f(g, 1.702)])])])


def _silu(g, x, bias, weights, prefix):
    y = _add(g, x, bias)
    return g.op("Mul", [y, g.op("Sigmoid", [y])])


def _mish(g, x, bias, weights, prefix):
    y = _add(g, x, bias)
    return g.op("Mul", [y, g.op("Tanh", [g.op("Softplus", [y])])])


def _laplace(g, x, bias, weights, prefix):
    """0.5 (1 + erf((x - mu) / (sigma sqrt 2))), mu 0.707107, sigma 0.282095 (transformers' defaults)."""
    y = g.op("Div", [g.op("Sub", [_add(g, x, bias), _f(g, 0.707107)]), _f(g, 0.282095 * math.sqrt(2.0))])
    return g.op("Mul", [g.op("Add", [g.op("Erf", [y]), _f(g, 1.0)]), _f(g, 0.5)])


def _relu2(g, x, bias, weights, prefix):
    r = g.op("Relu", [_add(g, x, bias)])
    return g.op("Mul", [r, r])


def _unary(op_type, **attrs):
    return lambda g, x, bias, weights, prefix: g.op(op_type, [_add(g, x, bias)], **attrs)


def _prelu(g, x, bias, weights, prefix):
    """torch's PReLU with its learned slope (one value, `mlp.act.weight`)."""
    return g.op("PRelu", [_add(g, x, bias), g.weight(prefix + ".weight", weights[prefix + ".weight"])])


def _xielu(g, x, bias, weights, prefix):
    """xIELU (arXiv 2411.13010), as transformers computes it on CPU: x > 0: alpha_p x^2 + beta x, else
    (expm1(min(x, eps)) - x) alpha_n + beta x, with alpha_p = softplus(a_p) and alpha_n = beta + softplus(a_n)
    worked out in bfloat16 like transformers' parameters."""
    alpha_p, alpha_n, beta, eps = xielu_constants(weights, prefix)
    y = _add(g, x, bias)
    beta_x = g.op("Mul", [_f(g, beta), y])
    positive = g.op("Add", [g.op("Mul", [g.op("Mul", [_f(g, alpha_p), y]), y]), beta_x])
    expm1 = g.op("Sub", [g.op("Exp", [g.op("Min", [y, _f(g, eps)])]), _f(g, 1.0)])
    negative = g.op("Add", [g.op("Mul", [g.op("Sub", [expm1, y]), _f(g, alpha_n)]), beta_x])
    return g.op("Where", [g.op("Greater", [y, _f(g, 0.0)]), positive, negative])


def xielu_constants(weights, prefix) -> tuple[float, float, float, float]:
    import torch

    def param(name):  # the checkpoint's value as transformers' bfloat16 parameter holds it
        return torch.from_numpy(np.asarray(weights[f"{prefix}.{name}"], dtype=np.float32)).to(torch.bfloat16)

    softplus = torch.nn.functional.softplus
    beta = param("beta")
    values = (softplus(param("alpha_p")), beta + softplus(param("alpha_n")), beta, param("eps"))
    return tuple(float(v.float().reshape(-1)[0]) for v in values)


ACTIVATIONS = {
    **dict.fromkeys(TANH_GELU, _tanh_gelu),
    **dict.fromkeys(ERF_GELU, _erf_gelu),
    "gelu_10": _gelu_10,
    "quick_gelu": _quick_gelu,
    "silu": _silu,
    "swish": _silu,
    "mish": _mish,
    "laplace": _laplace,
    "relu": _unary("Relu"),
    "relu2": _relu2,
    "relu6": lambda g, x, bias, weights, prefix: g.op("Clip", [_add(g, x, bias), _f(g, 0.0), _f(g, 6.0)]),
    "leaky_relu": _unary("LeakyRelu", alpha=0.01),  # torch's default negative_slope
    "sigmoid": _unary("Sigmoid"),
    "tanh": _unary("Tanh"),
    "linear": lambda g, x, bias, weights, prefix: _add(g, x, bias),
    "prelu": _prelu,
    "xielu": _xielu,
}
WEIGHTS = {"prelu": ("weight",), "xielu": ("alpha_p", "alpha_n", "beta", "eps")}  # mlp.act.* each layer needs


def check_activation(name, where: str) -> None:
    """Refuse an activation transformers' GPT-2 would not build, naming the ones edgelm exports."""
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise ExportError(
            f"{where} sets activation_function={name!r}, which is not one of transformers' activations; edgelm "
            f"exports {', '.join(sorted(ACTIVATIONS))}."
        )


def mlp_activation(g, name: str, x: str, bias: str, weights: dict, prefix: str) -> str:
    """act(x + bias) for layer prefix `transformer.h.{i}.mlp.act`."""
    return ACTIVATIONS[name](g, x, bias, weights, prefix)
