"""The kernel-template library: parametrised Triton and torch implementations of registry ops, and
their rendering into self-contained candidate files (no torch import at package import time).

    from agents.templates import templates_for, Choice, render_candidate
    t = templates_for("rms_norm", device="cuda")[0]
    source = render_candidate([Choice(t, t.default())])
"""

from agents.templates.base import (Choice, Knob, Template, TemplateError, load_candidate,
                                   render_candidate)
from agents.templates.library import TEMPLATES, dims_of, get_template, templates_for

__all__ = ["Choice", "Knob", "Template", "TemplateError", "TEMPLATES", "dims_of", "get_template",
           "load_candidate", "render_candidate", "templates_for"]
