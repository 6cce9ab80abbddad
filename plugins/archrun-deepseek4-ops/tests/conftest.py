"""archrun-deepseek4-ops's tests: archrun's conformance kit (docs/conformance.md) on its ops. Activation
"swiglu_clamp" takes its limit from the file, so the fast-op check runs on these: DeepSeek-V4's 10, a limit
that clamps most inputs, and none (0: plain SwiGLU)."""

from archrun.conformance import Conformance

archrun_conformance = Conformance("deepseek4-ops", op_specs={
    "activation=swiglu_clamp": [dict(limit=10.0), dict(limit=0.5), dict(limit=0.0)],
}, op_deviations={
    "activation=swiglu_clamp": {
        "*extreme values": "archrun-blocks' SiLU part gives x / (1 + e^87) below its exp clamp: -4.9 at "
                           "x = -3.4e38, where the reference gives -0; the clamp keeps every other output "
                           "small, so the kit's relative bound sees it",
    },
})
