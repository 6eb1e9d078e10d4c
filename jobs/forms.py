"""Forms of the web UI: the job list filter and the submit form (with its optional array, sweep and after fields).

The submit form only type-checks; what may be submitted (membership, the group's images and instance types,
quotas, bounds) is decided by ``jobs.services.job_spec_validate``, whose per-field errors the view maps back.
"""

from __future__ import annotations

import math
from typing import Any

from django import forms
from django.conf import settings
from django.urls import reverse

from . import limits, selectors
from .choices import JobType, Phase, Priority
from .models import Group, Job
from .templatetags.job_display import cpu, memory, seconds

PRIORITY_BY_LABEL = {p.label: p.value for p in Priority}
LABEL_BY_PRIORITY = {p.value: p.label for p in Priority}

# Service error keys → form field names (the form uses the words users know).
SERVICE_FIELD = {"active_deadline_seconds": "timeout", "backoff_limit": "retries"}


class JobFilterForm(forms.Form):
    """Only renders the filters (as selects); ``jobs.filtersets.JobFilterSet`` does the filtering."""

    group = forms.ChoiceField(required=False)
    phase = forms.ChoiceField(required=False, choices=[("", "Any phase"), *Phase.choices])
    user = forms.CharField(required=False, widget=forms.TextInput(attrs={"placeholder": "username", "size": 12}))

    def __init__(self, *args: Any, groups: list[str], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["group"].choices = [("", "All groups"), *((g, g) for g in groups)]


def parse_env(text: str) -> dict[str, str]:
    """``KEY=VALUE`` per line; blank lines and ``#`` comments are skipped. Errors name the line."""
    env: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep:
            raise forms.ValidationError(f"Line {number} ({_quote(line)}): expected KEY=VALUE.", code="env_line")
        if not limits.ENV_NAME_RE.match(key):
            raise forms.ValidationError(
                f"Line {number} ({_quote(line)}): '{key}' is not a valid variable name "
                "(letters, digits and _, not starting with a digit).",
                code="env_name",
            )
        if key in env:
            raise forms.ValidationError(f"Line {number}: {key} is set twice.", code="env_duplicate")
        env[key] = value
    return env


def sweep_value(text: str) -> str | int | float:
    """A sweep value as written: a number when it looks like one ("3" → 3, "1e-4" → 0.0001), else the text."""
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def parse_sweep(text: str) -> dict[str, list[str | int | float]]:
    """``name=v1,v2,...`` per line (blank lines and ``#`` comments skipped) → {name: [values]}. What the names and
    values may be is the service's check; this only reads the lines, naming the one it cannot read."""
    sweep: dict[str, list[str | int | float]] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, values = line.partition("=")
        name = name.strip()
        if not sep or not name or not values.strip():
            raise forms.ValidationError(f"Line {number} ({_quote(line)}): expected name=value,value,…",
                                        code="sweep_line")
        if name in sweep:
            raise forms.ValidationError(f"Line {number}: {name} is swept twice.", code="sweep_duplicate")
        sweep[name] = [sweep_value(v) for v in values.split(",") if v.strip()]
    return sweep


def _quote(line: str, width: int = 40) -> str:
    return line if len(line) <= width else line[: width - 1] + "…"


def format_env(env: dict[str, Any]) -> str:
    return "\n".join(f"{k}={v}" for k, v in env.items())


def _command_size(value: str) -> None:
    """The command's size in bytes, said in the error, so a huge paste is refused next to its field."""
    size = len(value.encode())
    if size > limits.COMMAND_MAX_BYTES:
        shown = f"{size / (1 << 20):.1f} MiB" if size >= 1 << 20 else f"{size:,} bytes"
        raise forms.ValidationError(
            f"The command is longer than {limits.COMMAND_MAX_BYTES // 1024} KiB: it is {shown}. "
            "Put a long script in a file (in the image or the group's volume) and run that.",
            code="command_size",
        )


class JobSubmitForm(forms.Form):
    name = forms.CharField(
        required=False,
        max_length=limits.NAME_MAX,
        help_text="Defaults to the command's program name.",
        widget=forms.TextInput(attrs={"placeholder": "e.g. resnet50-baseline", "autocomplete": "off"}),
    )
    # Group, image and instance type are names: the selects offer the group's choices, the service decides.
    group = forms.CharField(widget=forms.Select)
    image = forms.CharField(widget=forms.Select)
    instance_type = forms.CharField(widget=forms.Select, label="Instance type", help_text="Per replica.")
    command = forms.CharField(
        strip=False,
        error_messages={"required": "Enter a command."},
        validators=[_command_size],
        # maxlength counts characters, the limit bytes: the browser stops most of an oversized paste, the validator
        # the rest.
        widget=forms.Textarea(
            attrs={"rows": 6, "spellcheck": "false", "class": "mono", "placeholder": "python train.py --epochs 10",
                   "maxlength": limits.COMMAND_MAX_BYTES}
        ),
        help_text=f"Run with bash -c. At most {limits.COMMAND_MAX_BYTES // 1024} KiB.",
    )
    env = forms.CharField(
        strip=False,
        required=False,
        label="Environment",
        widget=forms.Textarea(
            attrs={"rows": 4, "spellcheck": "false", "class": "mono", "placeholder": "LEARNING_RATE=0.001\nEPOCHS=10"}
        ),
        help_text="One KEY=VALUE per line.",
    )
    replicas = forms.IntegerField(min_value=1, max_value=limits.REPLICAS_MAX, initial=1,
                                  help_text="Processes started together, ranks 0…N-1.")
    job_type = forms.ChoiceField(choices=JobType.choices, initial=JobType.TRAINING, label="Job type",
                                 help_text="Training jobs retry on failure; interactive jobs restart in place.")
    priority = forms.ChoiceField(choices=[(p.label, p.label.capitalize()) for p in Priority],
                                 initial=Priority.NORMAL.label, help_text="Order inside the group's queue.")
    preemptible = forms.BooleanField(required=False,
                                     help_text="May run over quota on idle GPUs, and be preempted to give them back.")
    timeout = forms.IntegerField(
        required=False, min_value=1, max_value=limits.ACTIVE_DEADLINE_MAX, label="Timeout (seconds)",
    )
    retries = forms.IntegerField(
        required=False, min_value=0, max_value=limits.BACKOFF_LIMIT_MAX,
    )
    # Many jobs from one submission, and what they wait for.
    array = forms.CharField(
        required=False, max_length=200, label="Array",
        widget=forms.TextInput(attrs={"placeholder": "e.g. 0-9%2", "autocomplete": "off", "class": "mono"}),
        help_text="One job per index (JOB_ARRAY_INDEX), e.g. 0-99; %K runs at most K at once. "
                  "With a sweep, only the limit: %2.",
    )
    sweep = forms.CharField(
        strip=False, required=False, label="Sweep",
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false", "class": "mono",
                                     "placeholder": "lr=1e-4,3e-4,1e-3\nbs=32,64"}),
        help_text="One name=values line per parameter: one job per combination, each with SWEEP_<NAME> set.",
    )
    after = forms.CharField(
        strip=False, required=False, label="After",
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false", "class": "mono",
                                     "placeholder": "12:ok, array/5:any"}),
        help_text="Start only after these end: a job id or array/ID, then :ok (succeeded, the default), "
                  ":notok or :any; separated by commas or lines.",
    )

    def __init__(self, *args: Any, user, group: Group | None, groups: list[Group], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.user = user
        self.group = group
        self.fields["group"].widget.choices = [(g.name, g.name) for g in groups]
        images = list(selectors.images_for(group))
        self.fields["image"].widget.choices = [(i.name, i.name) for i in images]
        self.fields["instance_type"].widget.choices = [
            (it.name, f"{it.name} — {it.gpu} GPU · {cpu(it.cpu_millicores)} CPU · {memory(it.memory_bytes)}")
            for it in selectors.instance_types_for(group)
        ]
        deadline, backoff = settings.JOBSITE_DEFAULT_ACTIVE_DEADLINE_SECONDS, settings.JOBSITE_DEFAULT_BACKOFF_LIMIT
        interactive = getattr(settings, "JOBSITE_DEFAULT_INTERACTIVE_DEADLINE_SECONDS", deadline)
        self.fields["timeout"].help_text = (
            f"From admission. Blank: {seconds(deadline)}" + (f", {seconds(interactive)} for interactive jobs."
                                                            if interactive != deadline else ".")
        )
        self.fields["timeout"].widget.attrs["placeholder"] = str(deadline)
        self.fields["retries"].help_text = f"Retries after a failed attempt (training). Blank: {backoff}."
        self.fields["retries"].widget.attrs["placeholder"] = str(backoff)
        # Choosing a group re-renders the image and instance type selects with that group's choices (htmx);
        # without JavaScript the form's "Update" button does the same with a POST.
        self.fields["group"].widget.attrs.update({
            "hx-get": reverse("jobs:submit"),
            "hx-trigger": "change",
            "hx-include": "[name='image'],[name='instance_type']",
            "hx-target": "#group-fields",
            "hx-select": "#group-fields",
            "hx-swap": "outerHTML",
        })

    def clean_env(self) -> dict[str, str]:
        return parse_env(self.cleaned_data.get("env") or "")

    def clean_sweep(self) -> dict[str, list[str | int | float]]:
        return parse_sweep(self.cleaned_data.get("sweep") or "")

    def clean_after(self) -> list[dict[str, Any]]:
        from .dependencies import AfterInvalid, after_from_text

        try:
            return after_from_text((self.cleaned_data.get("after") or "").replace("\n", ","))
        except AfterInvalid as exc:
            raise forms.ValidationError(str(exc), code="after") from exc

    @property
    def is_array(self) -> bool:
        """Whether the submission makes an array (its array or sweep field is filled in)."""
        return bool((self.data.get("array") or "").strip() or (self.data.get("sweep") or "").strip())

    def array_data(self) -> dict[str, Any]:
        """The array text and sweep grid, as ``array_plan_validate`` takes them (None when left blank)."""
        d = self.cleaned_data
        return {"array": (d.get("array") or "").strip() or None, "sweep": d.get("sweep") or None}

    def spec_data(self) -> dict[str, Any]:
        """The type-checked values, named as ``job_spec_validate`` expects (fields that failed are left out)."""
        d = self.cleaned_data
        data: dict[str, Any] = {
            "name": d.get("name", ""),
            "group": d.get("group", ""),
            "image": d.get("image", ""),
            "instance_type": d.get("instance_type", ""),
            "command": d.get("command", ""),
            "env": d.get("env", {}),
            "job_type": d.get("job_type") or JobType.TRAINING,
            "priority": PRIORITY_BY_LABEL.get(d.get("priority", ""), Priority.NORMAL),
            "preemptible": d.get("preemptible", False),
            "active_deadline_seconds": d.get("timeout"),
            "backoff_limit": d.get("retries"),
        }
        if d.get("replicas") is not None:
            data["replicas"] = d["replicas"]
        if d.get("after"):
            data["after"] = d["after"]
        return data

    def add_service_errors(self, message_dict: dict[str, list[str]]) -> None:
        """Put the service's errors next to their fields, unless the form already flagged that field."""
        for key, messages in message_dict.items():
            field = SERVICE_FIELD.get(key, key)
            if field not in self.fields:
                field = None
            elif field in self.errors:
                continue
            for message in messages:
                self.add_error(field, message)


def initial_from_job(job: Job) -> dict[str, Any]:
    """The submit form's values that reproduce ``job``'s spec (clone)."""
    spec = selectors.job_spec_of(job)
    return {
        **{k: spec[k] for k in ("name", "group", "image", "instance_type", "command", "replicas", "job_type",
                                "preemptible")},
        "env": format_env(spec["env"]),
        "priority": LABEL_BY_PRIORITY.get(spec["priority"], Priority.NORMAL.label),
        "timeout": spec["active_deadline_seconds"],
        "retries": spec["backoff_limit"],
    }


# --- YAML job specs -----------------------------------------------------------------------------------------

# The fields of a YAML job spec: the API's names (POST /api/v1/jobs/), mapped to the submit form's.
YAML_FIELDS = {
    "name": "name", "group": "group", "image": "image", "instance_type": "instance_type", "command": "command",
    "env": "env", "replicas": "replicas", "job_type": "job_type", "priority": "priority",
    "preemptible": "preemptible", "backoff_limit": "retries", "active_deadline_seconds": "timeout",
}
YAML_MAX_BYTES = 128 * 1024


class JobSpecYamlForm(forms.Form):
    """A job spec pasted or uploaded as YAML; valid, it becomes the submit form's initial values."""

    spec = forms.CharField(
        required=False, strip=False, label="YAML job spec",
        widget=forms.Textarea(attrs={
            "rows": 8, "spellcheck": "false", "class": "mono",
            "placeholder": "name: resnet50\ngroup: phusers\nimage: base-notebook\ninstance_type: gpu-1\n"
                           "command: python train.py\nenv:\n  EPOCHS: 10",
        }),
        help_text="Fields as in the API: " + ", ".join(YAML_FIELDS) + ".",
    )
    spec_file = forms.FileField(required=False, label="or upload a .yaml file")

    def __init__(self, *args: Any, groups: list, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.groups = {g.name: g for g in groups}

    def clean(self) -> dict[str, Any]:
        upload = self.cleaned_data.get("spec_file")
        if upload is not None:
            if upload.size > YAML_MAX_BYTES:
                raise forms.ValidationError(f"The file is larger than {YAML_MAX_BYTES // 1024} KiB.")
            try:
                text = upload.read().decode("utf-8")
            except UnicodeDecodeError as exc:
                raise forms.ValidationError("The file is not UTF-8 text.") from exc
        else:
            text = self.cleaned_data.get("spec") or ""
        if not text.strip():
            raise forms.ValidationError("Paste a YAML job spec or choose a file.")
        if len(text.encode()) > YAML_MAX_BYTES:
            raise forms.ValidationError(f"The spec is longer than {YAML_MAX_BYTES // 1024} KiB.")
        self.cleaned_data["spec"] = text
        self.cleaned_data["initial"] = yaml_spec_initial(text, self.groups)
        return self.cleaned_data


def yaml_spec_initial(text: str, groups: dict[str, Group]) -> dict[str, Any]:
    """The submit form's initial values from a YAML job spec; ``ValidationError`` listing every problem.

    Read and type-checked exactly as the API reads a YAML submission (same loader, same serializer); only the
    group's images and instance types are checked here, the rest when the form is submitted.
    """
    from rest_framework.exceptions import ParseError

    from .api.parsers import load_yaml
    from .api.serializers import JobSubmitSerializer

    try:
        spec = load_yaml(text)
    except ParseError as exc:
        raise forms.ValidationError(str(exc.detail)) from exc
    if not isinstance(spec, dict):
        raise forms.ValidationError("A job spec is a mapping of field: value (e.g. \"command: python train.py\").")
    checked = JobSubmitSerializer(data=spec, partial=True)
    if not checked.is_valid():
        raise forms.ValidationError([
            f"{field}: {' '.join(str(m) for m in (messages if isinstance(messages, list) else [messages]))}"
            for field, messages in checked.errors.items()
        ])
    data = checked.validated_data
    initial: dict[str, Any] = {YAML_FIELDS[k]: v for k, v in data.items() if k in YAML_FIELDS and v is not None}
    if "env" in data:
        initial["env"] = format_env(data["env"])
    if "priority" in data:
        initial["priority"] = LABEL_BY_PRIORITY[data["priority"]]

    errors = []
    group = groups.get(initial.get("group", ""))
    if "group" in initial and group is None:
        errors.append(f"group: you are not a member of a group named '{initial['group']}'.")
    if group is not None:
        if "image" in initial and not selectors.images_for(group).filter(name=initial["image"]).exists():
            errors.append(f"image: '{initial['image']}' is not an image of group {group.name}.")
        if "instance_type" in initial and not selectors.instance_types_for(group).filter(
            name=initial["instance_type"]
        ).exists():
            errors.append(f"instance_type: '{initial['instance_type']}' is not an instance type of group {group.name}.")
    if errors:
        raise forms.ValidationError(errors)
    return initial
