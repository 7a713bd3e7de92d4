"""The model zoo: every torchvision classification model, timm models from each family and
transformers architectures from tiny configs, called as users call them (transformers models
with a padded `attention_mask`). Random weights, nothing downloaded. Shared by
`tests/test_zoo.py` (a sample, compared live with TorchDynamo) and `benchmarks/zoo.py` (all
of them, side by side, written to the README's zoo table).

`build(name)` returns (model in eval mode, positional inputs, keyword inputs)."""

from __future__ import annotations

import torch

TORCHVISION = [
    "alexnet", "convnext_base", "convnext_large", "convnext_small", "convnext_tiny", "densenet121",
    "densenet161", "densenet169", "densenet201", "efficientnet_b0", "efficientnet_b1",
    "efficientnet_b2", "efficientnet_b3", "efficientnet_b4", "efficientnet_b5", "efficientnet_b6",
    "efficientnet_b7", "efficientnet_v2_l", "efficientnet_v2_m", "efficientnet_v2_s", "googlenet",
    "inception_v3", "maxvit_t", "mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3",
    "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small", "regnet_x_16gf", "regnet_x_1_6gf",
    "regnet_x_32gf", "regnet_x_3_2gf", "regnet_x_400mf", "regnet_x_800mf", "regnet_x_8gf",
    "regnet_y_128gf", "regnet_y_16gf", "regnet_y_1_6gf", "regnet_y_32gf", "regnet_y_3_2gf",
    "regnet_y_400mf", "regnet_y_800mf", "regnet_y_8gf", "resnet101", "resnet152", "resnet18",
    "resnet34", "resnet50", "resnext101_32x8d", "resnext101_64x4d", "resnext50_32x4d",
    "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0",
    "squeezenet1_0", "squeezenet1_1", "swin_b", "swin_s", "swin_t", "swin_v2_b", "swin_v2_s",
    "swin_v2_t", "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19",
    "vgg19_bn", "vit_b_16", "vit_b_32", "vit_h_14", "vit_l_16", "vit_l_32", "wide_resnet101_2",
    "wide_resnet50_2",
]

# One or two of each family, the small variants.
TIMM = [
    "resnet50d", "regnetx_002", "regnety_002", "regnetz_b16", "efficientnet_b0",
    "tf_efficientnet_lite0", "mobilenetv3_small_050", "mobilenetv3_large_100",
    "mobilenetv4_conv_small", "ghostnet_050", "ghostnetv2_100", "rexnet_100", "densenet121",
    "dla34", "dla46_c", "dpn48b", "hrnet_w18_small", "cspresnet50", "cs3darknet_s",
    "vit_tiny_patch16_224", "deit_tiny_patch16_224", "beitv2_base_patch16_224",
    "swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256", "maxvit_pico_rw_256",
    "coatnet_pico_rw_224", "convit_tiny", "cait_xxs24_224", "crossvit_tiny_240", "levit_128s",
    "mobilevit_xxs", "mobilevitv2_050", "efficientformer_l1", "efficientformerv2_s0",
    "poolformer_s12", "poolformerv2_s12", "mixer_s32_224", "resmlp_12_224", "gmlp_ti16_224",
    "edgenext_xx_small", "fastvit_t8", "repvit_m1", "nf_resnet26", "eca_nfnet_l0",
    "xcit_nano_12_p16_224", "volo_d1_224", "pit_ti_224", "twins_pcpvt_small", "twins_svt_small",
    "eva02_tiny_patch14_224", "sequencer2d_s", "inception_v3", "inception_v4", "convnext_atto",
    "tiny_vit_5m_224", "efficientvit_b0", "tresnet_m", "mobileone_s0", "resnest14d",
    "res2net50_14w_8s", "selecsls42b", "ese_vovnet19b_dw", "hgnetv2_b0", "lcnet_050",
    "fbnetc_100", "gcvit_xxtiny", "nest_tiny", "pvt_v2_b0", "visformer_tiny", "coat_lite_tiny",
    "davit_tiny", "focalnet_tiny_srf", "inception_next_tiny", "starnet_s1", "mambaout_femto",
    "hiera_tiny_224", "caformer_s18", "fasternet_t0", "botnet26t_256", "skresnet18",
    "swiftformer_xs", "efficientvit_m0", "vit_relpos_small_patch16_224",
]

# transformers model types (AutoConfig.for_model), with the inputs each takes.
TRANSFORMERS_TEXT = [
    "bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "deberta-v2", "mpnet",
    "gpt2", "gpt_neo", "gptj", "gpt_neox", "opt", "bloom", "falcon", "llama", "mistral",
    "qwen2", "phi", "gemma", "layoutlm", "canine", "modernbert", "qwen3", "gemma2", "mixtral",
    "longformer", "xlm",
]
TRANSFORMERS_SEQ2SEQ = ["t5", "bart", "mbart", "pegasus", "blenderbot", "marian"]
TRANSFORMERS_OTHER = ["vit", "swin", "wav2vec2", "whisper"]
TRANSFORMERS = TRANSFORMERS_TEXT + TRANSFORMERS_SEQ2SEQ + TRANSFORMERS_OTHER

ZOO = ([f"torchvision/{n}" for n in TORCHVISION] + [f"timm/{n}" for n in TIMM]
       + [f"transformers/{n}" for n in TRANSFORMERS])

# Small enough that a config's sizes do not dominate; set where a config has the field.
_SMALL = dict(
    vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=96, n_embd=64, n_layer=2, n_head=4, d_model=64, encoder_layers=2,
    decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=96,
    decoder_ffn_dim=96, num_key_value_heads=2, max_position_embeddings=64, embedding_size=64,
    ffn_dim=96, hidden_dim=96, dim=64, n_layers=2, n_heads=4, num_layers=2, num_heads=4, d_ff=96,
    d_kv=16, rotary_dim=8, num_decoder_layers=2, pad_token_id=0, decoder_start_token_id=0,
    pooler_hidden_size=64, decoder_vocab_size=128,
)


def _torchvision(name: str):
    import torchvision

    # Small images where the architecture allows (capture does not depend on the size; the
    # eager runs do): vision transformers are built for 64×64, maxvit needs 224.
    kwargs = {"image_size": 56 if name == "vit_h_14" else 64} if name.startswith("vit_") else {}
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    size = {"maxvit_t": 224, "inception_v3": 96, "vit_h_14": 56}.get(name, 64)
    return model, (torch.randn(1, 3, size, size),), {}


def _timm(name: str):
    import timm

    model = timm.create_model(name, pretrained=False)
    size = model.pretrained_cfg.get("input_size", (3, 224, 224))
    return model, (torch.randn(1, *size),), {}


def _transformers(name: str):
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model(name)
    if name == "vit":
        config = AutoConfig.for_model(name, image_size=32, patch_size=8, hidden_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=96)
        return AutoModel.from_config(config), (), {"pixel_values": torch.randn(2, 3, 32, 32)}
    if name == "swin":
        config = AutoConfig.for_model(name, image_size=32, patch_size=4, embed_dim=16,
                                      depths=[1, 1], num_heads=[2, 2], window_size=4)
        return AutoModel.from_config(config), (), {"pixel_values": torch.randn(2, 3, 32, 32)}
    if name == "wav2vec2":
        config = AutoConfig.for_model(name, hidden_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=96,
                                      conv_dim=(32, 32), conv_stride=(5, 4), conv_kernel=(10, 8),
                                      num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                                      feat_extract_norm="layer", do_stable_layer_norm=True)
        values = torch.randn(2, 1600)
        mask = torch.ones(2, 1600, dtype=torch.long)
        mask[1, 1200:] = 0
        return AutoModel.from_config(config), (), {"input_values": values, "attention_mask": mask}
    if name == "whisper":
        config = AutoConfig.for_model(name, d_model=64, encoder_layers=2, decoder_layers=2,
                                      encoder_attention_heads=4, decoder_attention_heads=4,
                                      encoder_ffn_dim=96, decoder_ffn_dim=96, num_mel_bins=16,
                                      max_source_positions=32, max_target_positions=32,
                                      vocab_size=128, pad_token_id=0, decoder_start_token_id=1)
        features = torch.randn(2, 16, 64)
        decoder_ids = torch.randint(1, 128, (2, 6))
        return AutoModel.from_config(config), (), {"input_features": features,
                                                   "decoder_input_ids": decoder_ids}
    for key, value in _SMALL.items():
        if hasattr(config, key):
            setattr(config, key, value)
    if name in ("gpt_neox", "falcon", "phi"):
        config.partial_rotary_factor = getattr(config, "partial_rotary_factor", 1.0)
    model = AutoModel.from_config(config)
    ids = torch.randint(1, 128, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0
    kwargs = {"input_ids": ids, "attention_mask": mask}
    if config.is_encoder_decoder:
        kwargs["decoder_input_ids"] = torch.randint(1, 128, (2, 7))
    return model, (), kwargs


def build(name: str):
    """(model in eval mode, positional inputs, keyword inputs) for a zoo name
    ("torchvision/resnet18", "timm/convit_tiny", "transformers/gpt2"); seeded."""
    torch.manual_seed(0)
    suite, model_name = name.split("/", 1)
    model, args, kwargs = {"torchvision": _torchvision, "timm": _timm,
                           "transformers": _transformers}[suite](model_name)
    return model.eval(), args, kwargs


def tensors_of(output) -> list:
    """The tensors of a model output (tensor, tuple, list, dict, ModelOutput), in order,
    nested ones included."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict) or hasattr(output, "to_tuple"):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in tensors_of(item)]
    return []
