"""Tiny random-weight checkpoints, built from configs and saved to disk.

The code under test loads them through the real `from_pretrained(path)` path, so the
loading, preprocessing and inference code of each backend runs in CI without a download.
Tokenizers are made here too: a byte-level CLIP BPE with no merges (every character a
token) and a word-level tokenizer for the T5 side of FLUX.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

TEXT_DIM = 32


def _byte_vocab() -> dict[str, int]:
    # the byte-level BPE alphabet: printable bytes map to themselves, the rest above 255
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = [chr(b) for b in printable] + [chr(256 + n) for n in range(256 - len(printable))]
    vocab = {}
    for c in chars:
        vocab[c] = len(vocab)
    for c in chars:
        vocab[c + "</w>"] = len(vocab)
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    return vocab


def save_clip_tokenizer(folder: Path, max_length: int = 77) -> None:
    from transformers import CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(_byte_vocab()))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tok = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=max_length)
    tok.save_pretrained(folder)


def save_word_tokenizer(folder: Path, max_length: int = 512) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "</s>", "<unk>"] + [chr(c) for c in range(32, 127)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                  model_max_length=max_length)
    tok.save_pretrained(folder)


def _clip_text_config():
    from transformers import CLIPTextConfig

    return CLIPTextConfig(bos_token_id=len(_byte_vocab()) - 2, eos_token_id=len(_byte_vocab()) - 1, hidden_size=TEXT_DIM,
                          intermediate_size=37, num_attention_heads=4, num_hidden_layers=2, pad_token_id=1,
                          vocab_size=len(_byte_vocab()), projection_dim=TEXT_DIM, max_position_embeddings=77)


def build_tiny_sd(folder: Path) -> Path:
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(block_out_channels=(8, 16), layers_per_block=1, sample_size=16, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=TEXT_DIM,
                                norm_num_groups=4, attention_head_dim=4)
    vae = AutoencoderKL(block_out_channels=[8, 16], in_channels=3, out_channels=3,
                        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                        latent_channels=4, norm_num_groups=4, sample_size=32)
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1)
    text_encoder = CLIPTextModel(_clip_text_config())
    save_clip_tokenizer(folder / "_tok")
    from transformers import CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(folder / "_tok")
    pipe = StableDiffusionPipeline(unet=unet, vae=vae, scheduler=scheduler, text_encoder=text_encoder,
                                   tokenizer=tokenizer, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.save_pretrained(folder)
    return folder


def build_tiny_flux(folder: Path) -> Path:
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel, CLIPTokenizer, PreTrainedTokenizerFast, T5Config, T5EncoderModel

    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                         attention_head_dim=16, num_attention_heads=2, joint_attention_dim=TEXT_DIM,
                                         pooled_projection_dim=TEXT_DIM, axes_dims_rope=[4, 4, 8])
    vae = AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(8, 16), layers_per_block=1,
                        latent_channels=4, norm_num_groups=4, use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.0609, scaling_factor=1.5035,
                        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2)
    text_encoder = CLIPTextModel(_clip_text_config())
    t5 = T5EncoderModel(T5Config(vocab_size=100, d_model=TEXT_DIM, d_kv=8, d_ff=37, num_layers=1, num_heads=4,
                                 pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))
    save_clip_tokenizer(folder / "_tok")
    save_word_tokenizer(folder / "_tok2", max_length=512)
    pipe = FluxPipeline(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
                        text_encoder=text_encoder, tokenizer=CLIPTokenizer.from_pretrained(folder / "_tok"),
                        text_encoder_2=t5, tokenizer_2=PreTrainedTokenizerFast.from_pretrained(folder / "_tok2"))
    pipe.save_pretrained(folder)
    return folder


def build_tiny_clip(folder: Path) -> Path:
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer, CLIPVisionConfig

    torch.manual_seed(0)
    vision = CLIPVisionConfig(hidden_size=TEXT_DIM, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
                              image_size=32, patch_size=8, projection_dim=TEXT_DIM)
    config = CLIPConfig(text_config=_clip_text_config().to_dict(), vision_config=vision.to_dict(),
                        projection_dim=TEXT_DIM)
    CLIPModel(config).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    save_clip_tokenizer(folder / "_tok")
    CLIPTokenizer.from_pretrained(folder / "_tok").save_pretrained(folder)
    return folder


def build_tiny_dinov2(folder: Path) -> Path:
    from transformers import BitImageProcessor, Dinov2Config, Dinov2Model

    torch.manual_seed(0)
    Dinov2Model(Dinov2Config(hidden_size=TEXT_DIM, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                             image_size=28, patch_size=7)).save_pretrained(folder)
    BitImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 28, "width": 28}, do_center_crop=True,
                      image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]).save_pretrained(folder)
    return folder
