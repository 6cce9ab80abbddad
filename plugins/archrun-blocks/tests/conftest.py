"""archrun-blocks' tests: archrun's conformance kit (docs/conformance.md) on every op it registers
(registration; each fast op = its reference on random, ragged and extreme inputs, op by op and through
its kernel part). The models using the ops are the families'."""

from archrun.conformance import Conformance

archrun_conformance = Conformance("blocks")
