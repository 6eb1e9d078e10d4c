"""The admin's forms: a group's quota rows (limit at least the quota), a group with its allowed images and instance
types, and an instance type in cores and GiB."""

from __future__ import annotations

import re
from decimal import Decimal

from django import forms
from django.contrib.admin.widgets import FilteredSelectMultiple

from jobs.models import Group, GroupQuota, Image, InstanceType
from jobs.rules import fmt_amount

GIB = 1 << 30

# The Linux capabilities a container may be given back (capabilities(7)), by their Kubernetes names.
KNOWN_CAPABILITIES = frozenset("""
    AUDIT_CONTROL AUDIT_READ AUDIT_WRITE BLOCK_SUSPEND BPF CHECKPOINT_RESTORE CHOWN DAC_OVERRIDE DAC_READ_SEARCH
    FOWNER FSETID IPC_LOCK IPC_OWNER KILL LEASE LINUX_IMMUTABLE MAC_ADMIN MAC_OVERRIDE MKNOD NET_ADMIN
    NET_BIND_SERVICE NET_BROADCAST NET_RAW PERFMON SETFCAP SETGID SETPCAP SETUID SYS_ADMIN SYS_BOOT SYS_CHROOT
    SYS_MODULE SYS_NICE SYS_PACCT SYS_PTRACE SYS_RAWIO SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG SYSLOG WAKE_ALARM
""".split())
# An extended resource name: <domain>/<name>, e.g. nvidia.com/gpu or nvidia.com/mig-1g.10gb.
RESOURCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


class GroupQuotaForm(forms.ModelForm):
    class Meta:
        model = GroupQuota
        fields = ["resource", "quota", "limit", "user_quota"]

    def clean(self):
        cleaned = super().clean()
        quota, limit = cleaned.get("quota"), cleaned.get("limit")
        if quota is not None and limit is not None and limit < quota:
            resource = cleaned.get("resource") or ""
            shown = (lambda v: fmt_amount(resource, v)) if resource else str
            self.add_error(
                "limit",
                f"The limit ({shown(limit)}) must be at least the quota ({shown(quota)}): it is the borrowing "
                "ceiling above the guaranteed quota. Leave it empty to make the limit equal to the quota.",
            )
        return cleaned


class GroupAdminForm(forms.ModelForm):
    """The group, plus the images and instance types its members may use (their M2M lives on those models)."""

    images = forms.ModelMultipleChoiceField(
        Image.objects.all(), required=False, widget=FilteredSelectMultiple("images", is_stacked=False),
        help_text="Images the group's members may run.",
    )
    instance_types = forms.ModelMultipleChoiceField(
        InstanceType.objects.all(), required=False,
        widget=FilteredSelectMultiple("instance types", is_stacked=False),
        help_text="Instance types the group's members may request.",
    )

    class Meta:
        model = Group
        fields = ["name", "display_name", "description", "queue_stopped", "volume_path"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["images"].initial = list(self.instance.images.values_list("pk", flat=True))
            self.fields["instance_types"].initial = list(self.instance.instance_types.values_list("pk", flat=True))

    def _save_m2m(self):
        super()._save_m2m()
        self.instance.images.set(self.cleaned_data["images"])
        self.instance.instance_types.set(self.cleaned_data["instance_types"])


class InstanceTypeForm(forms.ModelForm):
    """CPU in cores and memory in GiB, stored as millicores and bytes."""

    cpu_cores = forms.DecimalField(
        label="CPU (cores)", min_value=Decimal("0.001"), max_digits=10, decimal_places=3,
        help_text="Per replica; 0.5 = 500 millicores.",
    )
    memory_gib = forms.DecimalField(  # no rounding: any byte count shows exactly and saves back unchanged
        label="Memory (GiB)", min_value=Decimal("0.001"), help_text="Per replica; 0.5 = 512 MiB."
    )

    class Meta:
        model = InstanceType
        fields = ["name", "display_name", "description", "gpu", "node_selector", "tolerations", "gpu_resource",
                  "capabilities"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["cpu_cores"].initial = (Decimal(self.instance.cpu_millicores) / 1000).normalize()
        self.fields["memory_gib"].initial = (Decimal(self.instance.memory_bytes) / GIB).normalize()

    def clean_node_selector(self):
        value = self.cleaned_data.get("node_selector") or {}
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise forms.ValidationError('A JSON object of label to value, e.g. {"gpu-type": "a100"}.')
        return value

    def clean_tolerations(self):
        value = self.cleaned_data.get("tolerations") or []
        if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
            raise forms.ValidationError(
                'A JSON list of Kubernetes tolerations, e.g. [{"key": "nvidia.com/gpu", "operator": "Exists"}].'
            )
        return value

    def clean_gpu_resource(self):
        value = (self.cleaned_data.get("gpu_resource") or "").strip()
        if value and not RESOURCE_NAME.match(value):
            raise forms.ValidationError(
                "An extended resource name such as nvidia.com/gpu or nvidia.com/mig-1g.10gb (empty: the default).")
        return value

    def clean_capabilities(self):
        value = self.cleaned_data.get("capabilities") or []
        if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
            raise forms.ValidationError('A JSON list of Linux capability names, e.g. ["IPC_LOCK"].')
        names = [c.strip().upper().removeprefix("CAP_") for c in value]
        unknown = sorted({n for n in names if n not in KNOWN_CAPABILITIES})
        if unknown:
            raise forms.ValidationError(f"Unknown Linux capabilities: {', '.join(unknown)} (e.g. IPC_LOCK, SYS_NICE).")
        return sorted(set(names))

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("cpu_cores") is not None:
            self.instance.cpu_millicores = int(cleaned["cpu_cores"] * 1000)
        if cleaned.get("memory_gib") is not None:
            self.instance.memory_bytes = int(cleaned["memory_gib"] * GIB)
        return cleaned
