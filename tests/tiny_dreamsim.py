"""DreamSim's ensemble with random weights, written as `dreamsim(cache_dir=DIR)` expects DIR.

The real architecture, built here from dreamsim's own classes: three ViT-B/16 backbones in
DINO's layout (DINO, and CLIP and OpenCLIP converted to it, each with its projection), the
DINO projection head, the torch.hub repository DreamSim loads DINO from (a stand-in
`hubconf.py` that builds DINO's ViT-B/16 and reads its weights from the hub cache, as the
real one does), and a LoRA adapter on every attention `qkv`. Nothing is downloaded. Needs
the `dreamsim` extra (torchvision, open_clip, timm): `make test-extras`.
"""

from __future__ import annotations

from pathlib import Path

DINO_URL = "https://dl.fbaipublicfiles.com/dino/dino_vitbase16_pretrain/dino_vitbase16_pretrain.pth"

HUBCONF = f'''dependencies = ["torch"]

import torch
from dreamsim.feature_extraction.vision_transformer import vit_base


def dino_vitb16(pretrained=True, **kwargs):
    model = vit_base(patch_size=16, num_classes=0, **kwargs)
    if pretrained:  # read from the hub cache's checkpoints folder, where the test put the weights
        model.load_state_dict(torch.hub.load_state_dict_from_url("{DINO_URL}", map_location="cpu"))
    return model
'''


def _vit_as_dino(torch, vit_base, seed: int) -> dict:
    """A CLIP-style ViT-B/16 in DINO's layout (pre-norm as `pos_drop`), with its projection."""
    torch.manual_seed(seed)
    vit = vit_base(patch_size=16)
    vit.pos_drop = torch.nn.LayerNorm(vit.embed_dim)
    state = vit.state_dict()
    state["proj"] = torch.randn(vit.embed_dim, 512) / vit.embed_dim**0.5
    return {"state_dict": state}


def build_tiny_dreamsim(folder: Path, seed: int = 0) -> Path:
    import torch
    from dreamsim.config import dreamsim_args
    from dreamsim.feature_extraction.vision_transformer import DINOHead, vit_base
    from dreamsim.model import PerceptualModel
    from peft import LoraConfig, get_peft_model

    folder = Path(folder)
    # dreamsim makes the weights folder torch.hub's folder: the DINO repository and its weights go there
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    (folder / "facebookresearch_dino_main").mkdir(exist_ok=True)
    (folder / "facebookresearch_dino_main" / "hubconf.py").write_text(HUBCONF)

    torch.manual_seed(seed)
    torch.save(vit_base(patch_size=16, num_classes=0).state_dict(), folder / "checkpoints" / DINO_URL.rsplit("/", 1)[1])
    head = DINOHead(768, 2048)
    student = {f"module.head.mlp.{name}": tensor for name, tensor in head.mlp.state_dict().items()}
    student["module.head.last_layer.weight"] = head.last_layer.weight.detach().clone()
    torch.save({"student": student}, folder / "dino_vitb16_pretrain.pth")
    torch.save(_vit_as_dino(torch, vit_base, seed + 1), folder / "clip_vitb16_pretrain.pth.tar")
    torch.save(_vit_as_dino(torch, vit_base, seed + 2), folder / "open_clip_vitb16_pretrain.pth.tar")

    # The adapter: DreamSim's LoRA settings, with random (not zero) B matrices so it changes the output.
    model = PerceptualModel(**dreamsim_args["model_config"]["ensemble"], device="cpu", load_dir=str(folder),
                            normalize_embeds=True)
    torch.manual_seed(seed + 3)
    lora = LoraConfig(r=16, lora_alpha=0.5, lora_dropout=0.3, bias="none", target_modules=["qkv"],
                      init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(folder / "ensemble_lora")
    return folder
