"""The admin of what groups may be allowed to use: instance types (per replica GPUs, cores, GiB, Kubernetes
placement) and images."""

from __future__ import annotations

from django.contrib import admin

from jobs.choices import Resource
from jobs.models import Image, InstanceType
from jobs.rules import fmt_amount

from .forms import InstanceTypeForm
from .scheduling_pass import request_pass_after_commit


@admin.register(InstanceType)
class InstanceTypeAdmin(admin.ModelAdmin):
    form = InstanceTypeForm
    list_display = ["name", "display_name", "gpu", "cpu", "memory", "node_selector", "tolerations"]
    search_fields = ["name", "display_name"]
    fieldsets = [
        (None, {"fields": ["name", "display_name", "description"]}),
        ("Per replica", {"fields": ["gpu", "cpu_cores", "memory_gib"]}),
        ("Kubernetes", {"fields": ["node_selector", "tolerations", "gpu_resource", "capabilities"]}),
        ("Allowed for", {"fields": ["groups"]}),
    ]
    filter_horizontal = ["groups"]

    @admin.display(description="CPU", ordering="cpu_millicores")
    def cpu(self, it: InstanceType) -> str:
        return fmt_amount(Resource.CPU, it.cpu_millicores)

    @admin.display(description="memory", ordering="memory_bytes")
    def memory(self, it: InstanceType) -> str:
        return fmt_amount(Resource.MEMORY, it.memory_bytes)

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        request_pass_after_commit()


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ["name", "url", "local_root"]
    search_fields = ["name", "url"]
    fields = ["name", "url", "local_root", "description", "groups"]
    filter_horizontal = ["groups"]
