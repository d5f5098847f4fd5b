"""Which model to build for each Hugging Face model type, a small valid config for it, and
inputs for its modality. Everything is made locally from config classes: no downloads."""
import copy
import inspect

import torch

# Task heads in the order a representative class is picked (the first mapping that has
# the model type), each with the modality family it reports under.
HEADS = [
    ("causal_lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "decoder"),
    ("seq2seq_lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "encoder-decoder"),
    ("masked_lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "encoder"),
    ("sequence_classification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "encoder"),
    ("speech_seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "audio"),
    ("ctc", "MODEL_FOR_CTC_MAPPING_NAMES", "audio"),
    ("audio_classification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "audio"),
    ("image_classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "vision"),
    ("image_text_to_text", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "multimodal"),
    ("base", "MODEL_MAPPING_NAMES", "other"),
]

# Config fields shrunk wherever they appear (sub-configs too). Head and width values keep
# head_dim = 16 and widths divisible by every head count used here.
SMALL = {
    "hidden_size": 32, "d_model": 32, "n_embd": 32, "embed_dim": 32, "dim": 32, "d_embed": 32,
    "word_embed_proj_dim": 32, "embedding_size": 32, "projection_dim": 32, "text_embed_dim": 32,
    "intermediate_size": 64, "ffn_dim": 64, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
    "n_inner": 64, "hidden_dim": 64, "d_ff": 64, "d_inner": 64, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "encoder_layers": 1,
    "decoder_layers": 1, "num_decoder_layers": 1, "num_encoder_layers": 1,
    "num_attention_heads": 2, "n_head": 2, "n_heads": 2, "encoder_attention_heads": 2,
    "decoder_attention_heads": 2, "num_heads": 2, "num_key_value_heads": 1,
    "multi_query_group_num": 1, "head_dim": 16, "d_kv": 16, "attention_head_dim": 16,
    "vocab_size": 128, "max_position_embeddings": 64, "n_positions": 64, "n_ctx": 64,
    "max_source_positions": 32, "max_target_positions": 32,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "num_experts_per_token": 2,
    "moe_topk": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
    "image_size": 32, "patch_size": 4, "num_channels": 3, "num_mel_bins": 16,
    "conv_dim": [16, 16], "conv_stride": [5, 2], "conv_kernel": [10, 3], "num_feat_extract_layers": 2,
    "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2,
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": 16, "num_labels": 3, "emb_dim": 32, "mamba_dt_rank": 8,
    "decoder_vocab_size": 128, "src_vocab_size": 128, "tgt_vocab_size": 128,
    "input_feat_per_channel": 16, "n_group": 1, "topk_group": 1, "n_groups": 1, "mamba_n_groups": 1, "num_kv_shared_layers": 0, "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 16, "num_dense_layers": 1, "attention_window": 4, "out_hidden_size": 32, "base_channels": 32,
    "num_groups": 1, "decoder_hidden_size": 32, "d_latents": 32, "num_latents": 16,
    "num_self_attends_per_block": 2, "mlp_dim": 64, "width_coefficient": 0.25, "depth_coefficient": 0.25,
    "vocab_size_per_layer_input": 128, "num_frames": 4, "hidden_size_per_layer_input": 16, "window_size": 4,
    # Linear-attention (KDA) and sparse-attention indexer heads are sized apart from the
    # attention heads: left at 64 x 128, a 32-wide model carried 24,576 conv channels.
    "linear_num_heads": 2, "linear_head_dim": 16, "index_n_heads": 2, "index_head_dim": 16,
    "projection_intermediate_size": 64,  # a vision merger's hidden layer (10,240 in GLM-5-Next)
}
TIME_SERIES = {"prediction_length": 4, "context_length": 8, "lags_sequence": [1, 2, 3],
               "num_time_features": 1}
# Arguments given when the config is made, for fields its own __init__ derives others from.
# Probabilistic forecasters need a horizon (no default): 4 steps from 8, lags 1-3.
# Chameleon maps each VQ code to a BPE token named IMGIMG<code, digits as letters A-J>Z and
# has no default map: 32 codes at ids 64..95, the image placeholder at 100; a 32 x 32 image
# is then 2 x 2 codes.
CHAMELEON = {"vocabulary_map": {**{"IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(i)) + "Z": 64 + i
                                   for i in range(32)}, "<image>": 100},
             "vq_config": {"num_embeddings": 32, "resolution": 32, "embed_dim": 32, "base_channels": 32}}
INIT = {"autoformer": {**TIME_SERIES, "label_length": 4}, "informer": TIME_SERIES, "time_series_transformer": TIME_SERIES,
        "chameleon": CHAMELEON,
        # Its text layers always route to experts, but the default sets no expert counts; its
        # vision tower's default config is Gemma 4's (given: an unset one is built as None).
        "diffusion_gemma": {"text_config": {"num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32},
                            "vision_config": {}}}
# Composite types have no default sub-configs: (encoder or vision, decoder or text) types.
COMPOSITE = {"encoder-decoder": ("bert", "bert"), "vision-encoder-decoder": ("vit", "gpt2"),
             "speech-encoder-decoder": ("wav2vec2", "bert"), "vision-text-dual-encoder": ("vit", "bert")}
# Composites whose config class has no default for its AutoConfig parts (MusicGen: a
# text encoder and an audio codec around its own decoder): the released pairing's types.
PARTS_OF = {"musicgen": {"text_encoder": "t5", "audio_encoder": "encodec"},
            "musicgen_melody": {"text_encoder": "t5", "audio_encoder": "encodec"}}
# Decoders over codec codes flattened to (batch x codebooks, steps) rows.
FLAT_CODES = ("musicgen_decoder", "musicgen_melody_decoder")
MIMI = {"upsample_groups": 32, "codebook_size": 64, "codebook_dim": 32, "num_quantizers": 4,
        "vector_quantization_hidden_dimension": 32, "num_filters": 8}
QSA = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 4,
       "indexer_compress_ratio": 2}
SAM2 = {"vision_config.backbone_config.image_size": [64, 64],
        "vision_config.backbone_feature_sizes": [[16, 16], [8, 8], [4, 4]],
        "prompt_encoder_config.image_size": 64, "prompt_encoder_config.patch_size": 16}
ROPE_PER_LAYER_TYPE = {t: {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [3, 3, 2]}
                       for t in ("full_attention", "sliding_attention")}
# Per-family constraints the generic sizes miss: CodeGen splits heads over 4 model-parallel shards.
# LFM2-MoE has no default layer pattern (checkpoints carry one).
# BridgeTower's vision tower takes one head per 64 channels. Keys with a dot name a sub-config.
FAMILY = {"codegen": {"n_head": 4},
          "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_hidden_layers": 2},
          "bridgetower": {"vision_config.hidden_size": 64},
          # LXMERT counts its three stacks (language, cross-modal, region) under names of its
          # own: left alone, a small config kept 19 layers, and a cold compile of its fused
          # step passed the 300 s timeout.
          "lxmert": {"l_layers": 2, "x_layers": 1, "r_layers": 1},
          # Aria's projector maps the patch count (8 x 8 here) to its query count.
          "aria": {"projector_patch_to_query_dict": {64: 4},
                   "max_value_projector_patch_to_query_dict": 4},
          # EfficientNet towers: the last stage's width (320 x width_coefficient) is what the
          # top batch norm (EfficientNet) or the image embedding (ALIGN) sees.
          "efficientnet": {"hidden_dim": 320},
          "align": {"projection_dim": 80},
          # BLT's encoder hands k patches' worth of width to the global model: keep k = 1.
          "blt": {"cross_attn_k": 1, "encoder_config.cross_attn_k": 1, "decoder_config.cross_attn_k": 1},
          # Defaults that leave the experts unset (checkpoints set them).
          "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},
          "esm": {"pad_token_id": 1, "mask_token_id": 2},
          # LW-DETR's default projects no feature level (checkpoints list one or two scales).
          # Its queries are picked from the anchors, as RT-DETR's.
          "lw_detr": {"projector_scale_factors": [1.0], "num_queries": 8},
          # ViViT cuts (frames, height, width) tubelets; RT-DETR picks its queries from the
          # few anchors a 32 x 32 image has.
          "vivit": {"tubelet_size": [2, 4, 4]},
          "rt_detr": {"num_queries": 8}, "rt_detr_v2": {"num_queries": 8},
          "grounding-dino": {"num_queries": 8}, "mm-grounding-dino": {"num_queries": 8},
          "d_fine": {"num_queries": 8}, "deimv2": {"num_queries": 8}, "pp_doclayout_v3": {"num_queries": 8},
          # Nemotron's default leaves the key/value heads unset; Reformer's LM head is a decoder.
          "nemotron": {"num_key_value_heads": 2}, "reformer": {"is_decoder": True, "axial_pos_embds_dim": (16, 16), "axial_pos_shape": (2, 4)},
          # DBRX's attention reads a rope_theta its v5 config no longer holds.
          # Zamba shares one transformer block across its hybrid layers: keep two of them.
          "zamba": {"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"]},
          # Layout models cut the width into 6 box embeddings (LiLT) or 4 x dim_bbox (BROS).
          "lilt": {"hidden_size": 48}, "bros": {"hidden_size": 64},
          # Gemma 3 pools the 8 x 8 patches of a 32 x 32 image to 2 x 2 tokens.
          "gemma3": {"mm_tokens_per_image": 4}, "shieldgemma2": {"mm_tokens_per_image": 4, "yes_token_index": 5, "no_token_index": 6},
          "t5gemma2": {"encoder.mm_tokens_per_image": 4},
          # Its encoder alone: the MLP reads a dropout rate the full model's config sets.
          "t5gemma2_encoder": {"mm_tokens_per_image": 4, "text_config.dropout_rate": 0.0},
          # Qwen3-ASR cuts mel frames into chunks of 2 x n_window, and its length formula
          # assumes n_window = 50 (13 outputs per chunk): one 100-frame chunk (frames are
          # 2 x max_source_positions here).
          "qwen3_asr": {"audio_config.n_window": 50, "audio_config.n_window_infer": 100,
                        "audio_config.max_source_positions": 50, "audio_config.output_dim": 32},
          "qwen3_asr_encoder": {"n_window": 50, "n_window_infer": 100, "max_source_positions": 50},
          "step3p7": {"text_config.sliding_window": 4},
          "vjepa2": {"pred_hidden_size": 32, "pred_num_hidden_layers": 1, "pred_num_attention_heads": 2,
                     "crop_size": 32, "frames_per_clip": 4},
          "longcat_flash": {"ffn_hidden_size": 64, "expert_ffn_hidden_size": 32, "zero_expert_num": 2},
          # Omni thinkers read the vision-start marker their checkpoints' top config holds.
          "qwen2_5_omni_thinker": {"vision_start_token_id": 113},
          "qwen3_omni_moe_thinker": {"vision_start_token_id": 113},
          # OneFormer's decoder runs decoder_layers - 1 layers: keep one.
          # The pixel decoder's width follows the shrunk hidden size, as in the released
          # configs (both 256): a projection only exists when they differ, and these models
          # keep it in a plain list that .to(device) does not move (a CPU weight on any
          # accelerator).
          "oneformer": {"decoder_layers": 2, "conv_dim": 64, "mask_dim": 64},
          "mask2former": {"mask_feature_size": 64, "feature_size": 64},
          # YOLOS defaults to 512 x 864 images: with the shrunk 4-pixel patches that is a
          # 27,749-token attention (25 GB of scores on a device without a blocked kernel).
          "yolos": {"image_size": [32, 48]},
          # Gemma 4's audio projection assumes the mel bins equal the first conv's
          # channels (128 and 128 released): 32 and 32 here.
          "gemma4_audio": {"subsampling_conv_channels": [32, 16]},
          "seggpt": {"image_size": [64, 32]},
          # Perceiver's masked-LM decoder has one query per position: as many as the tokens.
          "perceiver": {"max_position_embeddings": 8},
          # Granite Speech's Q-Former projector reads the speech encoder's width.
          "granite_speech": {"projector_config.encoder_hidden_size": 64, "window_size": 10},
          "granite_speech_plus": {"projector_config.encoder_hidden_size": 64, "window_size": 10},
          # (Its Q-Former projector makes window_size / downsample_rate queries per window.)
          # Granite Speech 5 attends in blocks of context_size, its relative table spanning
          # max_position_embeddings each way.
          "granite_speech5_ctc": {"encoder_config.context_size": 16}, "granite_speech5_encoder": {"context_size": 16},
          # LeViT's stem is four stride-2 convolutions: its "patch" is 16 pixels.
          "levit": {"patch_size": 16, "image_size": 64},
          # Super-resolution embeds single pixels.
          "swin2sr": {"patch_size": 1, "image_size": 16, "window_size": 4},
          "dbrx": {"attn_config.rope_theta": 10000.0, "attn_config.clip_qkv": 8.0},
          # Mimi's upsampling convolution is depthwise over the codec width.
          # CSM embeds one code per Mimi quantizer: as many codebooks.
          "mimi": MIMI, "csm": {**{"codec_config." + k: v for k, v in MIMI.items()},
                                "num_codebooks": MIMI["num_quantizers"],
                                "depth_decoder_config.num_codebooks": MIMI["num_quantizers"]},
          "kyutai_speech_to_text": {"codec_config." + k: v for k, v in MIMI.items()},
          # Moonshine Streaming's decoder reads a key/value head count its config class
          # leaves to checkpoints.
          "moonshine_streaming": {"num_key_value_heads": 2},
          # Qwen4-Exp's indexed attention leaves its indexer to checkpoints: a small one
          # (one key/value head, as the class requires; a budget of whole compressed blocks).
          "qwen4_exp": {"text_config." + k: v for k, v in QSA.items()}, "qwen4_exp_text": QSA,
          # Cohere Compass keys its rotary parameters by layer type (the default has none), its
          # 3-D sections adding up to half the head size.
          "cohere_compass": {"text_config.rope_parameters": ROPE_PER_LAYER_TYPE},
          "cohere_compass_text": {"rope_parameters": ROPE_PER_LAYER_TYPE},
          # DeepSeek-OCR 2 leaves dense/sparse per layer to its checkpoints.
          # Its SAM neck's last channels are the vision encoder's width (896 and 896 released;
          # the class defaults, 896 and 4,096, disagree).
          "deepseek_ocr2": {"text_config.mlp_layer_types": ["dense", "sparse"],
                            "vision_config.sam_config.downsample_channels": [16, 32]},
          # SAM's shared positional embedding makes 2 x num_pos_feats channels: the prompt
          # encoder's width.
          "sam": {"vision_config.num_pos_feats": 16},
          # GLM-Image's VQ codes are token ids of its (shrunk, 128) vocabulary.
          "glm_image": {"vq_config.num_embeddings": 64},
          # CLAP folds the spectrogram into a spec_size square, freq_ratio = spec_size / mel
          # bins (4 released) strips of it, and unfolds the last Swin grid (spec_size / 32)
          # into them: at 16 bins and spec_size 256 the ratio is 16 and the grid 8. Its
          # Swin doubles the patch width over 4 stages to hidden_size (96 x 8 = 768 released).
          "clap": {"audio_config.num_mel_bins": 32, "audio_config.spec_size": 128,
                   "audio_config.patch_embeds_hidden_size": 16, "audio_config.hidden_size": 128},
          # SAM 2: a 64 x 64 image through the Hiera/timm stages (strides 4-32),
          # the prompt encoder's grid at stride 16, the feature sizes of the first three.
          "sam2": SAM2,
          "kosmos-2": {"latent_query_num": 4},
          # CLVP's encoders rotate at least 32 channels of each head: one 32-wide head.
          "clvp": {"text_config.num_attention_heads": 1, "speech_config.num_attention_heads": 1},
          # ERNIE 4.5 VL interleaves its height and width sections: equal sizes.
          "ernie4_5_vl_moe": {"text_config.rope_parameters": {"rope_theta": 500000.0, "rope_type": "default",
                                                              "mrope_section": [3, 3, 2]}},
          # PaddleOCR-VL's text rotary defaults its 3-D sections in code (for head size 128).
          "paddleocr_vl": {"text_config.rope_parameters": {"rope_theta": 500000.0, "rope_type": "default",
                                                           "mrope_section": [2, 3, 3]}},
          # Muse Glimmer's adapter reads pixel-shuffled patches: width x merge_size^2.
          "muse_glimmer": {"out_hidden_size": 128, "projector_hidden_size": 64},
          # Mistral 4's rotary part is head_dim x partial_rotary_factor (0.5): the query/key
          # width, twice the rope part.
          "mistral4": {"head_dim": 16},
          # FastSpeech 2's HiFi-GAN vocoder reads the acoustic model's mel bins.
          "fastspeech2_conformer_with_hifigan": {"vocoder_config.model_in_dim": 16},
          # EfficientLoFTR's 2-D rotary table is a quarter of the width: head size = width / 8.
          "efficientloftr": {"num_attention_heads": 8, "num_key_value_heads": 8, "out_features": [16, 16, 32, 32],
                             "fine_fusion_dims": [32, 32, 16]},
          # LayoutLMv3's patch position table is sized for input_size; TVP's frame prompt for
          # max_img_size.
          "layoutlmv3": {"hidden_size": 48, "coordinate_size": 8, "shape_size": 8, "input_size": 32},
          "tvp": {"max_img_size": 64, "visual_prompt_size": 4},
          # MobileViTV2 unfolds 2 x 2 patches at stride 32: a 64-pixel image keeps a 2 x 2 map.
          "mobilevitv2": {"patch_size": 2, "image_size": 64},
          # TextNet's first stage takes the stem's width.
          "textnet": {"stem_out_channels": 16, "image_size": [64, 64]},
          # SAM 3's tracker: the ViT's 8 x 8 grid scaled by 4, 2 and 1 in its neck.
          "sam3_tracker": {"vision_config.backbone_feature_sizes": [[32, 32], [16, 16], [8, 8]]}, "sam_hq": {"vision_config.num_pos_feats": 16},
          # DPT's depth neck reassembles one hidden state per neck stage (four).
          "dpt": {"num_hidden_layers": 4, "backbone_out_indices": [0, 1, 2, 3], "neck_hidden_sizes": [16, 16, 32, 32],
                  "fusion_hidden_size": 32, "head_hidden_size": 16},
          # DETR's mask head takes width + attention heads channels, a multiple of 8.
          "detr": {"encoder_attention_heads": 8, "decoder_attention_heads": 8},
          # Sapiens 2's task heads (pose, normals, pointmap, matting) read a head config the
          # class default leaves unset (checkpoints carry one): two stride-2 upsampling
          # blocks, one refinement conv, and for the pointmap a scale branch, one stride-2
          # conv over the 8 x 8 patch grid: 4 x 4 x 16 = 256 features into its MLP.
          "sapiens2": {"head_config": {"upsample_out_channels": [16, 16], "conv_out_channels": [16],
                                       "scale_conv_out_channels": [16], "scale_final_hidden_sizes": [16, 16],
                                       "scale_final_input_size": 256}},
          # Hiera's masked-autoencoder decoder is sized by fields the class leaves unset.
          "hiera": {"decoder_hidden_size": 32, "decoder_depth": 1, "decoder_num_heads": 2},
          # PP-OCRv6's detector: its backbone's class default is the recognizers' (height-
          # only strides, the last stage alone out), while the neck fuses four square-
          # strided stages (4 to 32); the neck's intra-class blocks' (kernel, stride,
          # padding) per conv, the head's kernels and each level's upsampling to the
          # stride-4 map are left to checkpoints (the PaddleOCR values; a 64-wide neck).
          "pp_ocrv6_medium_det": {"backbone_config": {
                                      "model_type": "pp_lcnet_v4", "stem_channels": [3, 8, 16], "out_indices": [1, 2, 3, 4],
                                      "block_configs": [[[3, 16, 16, 1, True]], [[3, 16, 32, 2, False]],
                                                        [[3, 32, 64, 2, False]], [[3, 64, 64, 2, True]]]},
                                  "neck_out_channels": 64, "kernel_list": [3, 2, 2], "scale_factor_list": [1, 2, 4, 8],
                                  "intraclass_block_config": {
                                      "reduce_channel": [1, 1, 0], "return_channel": [1, 1, 0],
                                      "vertical_long_to_small_conv_longratio": [[7, 1], 1, [3, 0]],
                                      "vertical_long_to_small_conv_midratio": [[5, 1], 1, [2, 0]],
                                      "vertical_long_to_small_conv_shortratio": [[3, 1], 1, [1, 0]],
                                      "horizontal_small_to_long_conv_longratio": [[1, 7], 1, [0, 3]],
                                      "horizontal_small_to_long_conv_midratio": [[1, 5], 1, [0, 2]],
                                      "horizontal_small_to_long_conv_shortratio": [[1, 3], 1, [0, 1]],
                                      "symmetric_conv_long_longratio": [7, 1, 3],
                                      "symmetric_conv_long_midratio": [5, 1, 2],
                                      "symmetric_conv_long_shortratio": [3, 1, 1]}},
          # RF-DETR picks its queries (per group) from the anchors of the patch grid.
          "rf_detr": {"num_queries": 8, "group_detr": 2},
          # MusicGen's EnCodec doubles num_filters over four stages into an LSTM (14M
          # parameters at 32); given its codes, the model never runs it.
          "musicgen": {"audio_encoder.num_filters": 4}, "musicgen_melody": {"audio_encoder.num_filters": 4},
          # SAM 2 Video builds SAM 2's image model: the same sizes.
          "sam2_video": SAM2,
          # PP-OCRv6's small detector: the same backbone default (the recognizers' height-only
          # strides, the last stage alone out) under a neck that fuses four square-strided
          # stages (4 to 32) whose widths it is told in layer_list_out_channels: the released
          # 12, 18 and 42, the top's 360 cut to 48.
          "pp_ocrv6_small_det": {"backbone_config": {
                                     "model_type": "pp_lcnet_v4", "stem_channels": [3, 8, 16], "out_indices": [1, 2, 3, 4],
                                     "block_configs": [[[3, 16, 12, 1, True]], [[3, 12, 18, 2, False]],
                                                       [[3, 18, 42, 2, False], [3, 42, 42, 1, True]],
                                                       [[3, 42, 48, 2, False], [3, 48, 48, 1, True]]]},
                                 "layer_list_out_channels": [12, 18, 42, 48]},
          # OmDet-Turbo's layer norms after the backbone read timm's channel-last maps (its
          # default Swin); the Hugging Face backbone built instead (timm is not installed)
          # gives channel-first maps, which the class takes with them off (as its own tests
          # build it). Its queries are picked from the anchors of a 32-pixel image (84); its
          # encoder hands the decoder one map per level at its width (a list the width
          # following misses). Its decoder projects the class and task embeddings (the text
          # tower's width, 512 released) to its own (256) only when the two differ (no
          # projection built otherwise, yet always called): a 64-wide text tower over it.
          "omdet-turbo": {"apply_layernorm_after_vision_backbone": False, "num_queries": 8,
                          "vision_features_channels": [32, 32, 32], "text_config.hidden_size": 64,
                          "text_projection_in_dim": 64, "text_projection_out_dim": 64, "class_embed_dim": 64},
          # UVDoc's head concatenates every bridge stage's map (connector width x 6 stages),
          # but the backbone's default outputs only the last: all six out. Its nested channel
          # tuples escape the generic shrink: the released widths / 4 (stem 8, stages 8-16-32,
          # bridge and head 32), the blocks' dilations and the bridge's six stages kept.
          "uvdoc": {"backbone_config": {
                        "model_type": "uvdoc_backbone", "resnet_head": [[3, 8], [8, 8]],
                        "resnet_configs": [[[8, 8, 1, False], [8, 8, 3, False]],
                                           [[8, 16, 1, True], [16, 16, 3, False]],
                                           [[16, 32, 1, True], [32, 32, 3, False]]],
                        "stage_configs": [[[32, 1]], [[32, 2]], [[32, 5]], [[32, 8], [32, 3], [32, 2]],
                                          [[32, 12], [32, 7], [32, 4]], [[32, 18], [32, 12], [32, 6]]],
                        "out_indices": [1, 2, 3, 4, 5, 6]},
                    "bridge_connector": [32, 32], "out_point_positions2D": [[32, 8], [8, 2]]},
}
# Image (height, width) for types whose config holds no image size: convolutional towers
# (stride 32, then a pool) that need more than 32 pixels; text recognizers read a line.
INPUT_SIZE = {"tvp": (64, 64), "pp_ocrv5_mobile_rec": (96, 64), "pp_ocrv5_server_rec": (96, 64),
              # HGNetV2 at 32 pixels ends on 1 x 1 maps, where train-mode batch norm over two
              # values leaves gradients that are zero in exact arithmetic (rounding noise
              # on CPU and tpu alike, float64 agreeing): 64 keeps 2 x 2.
              "hgnet_v2": (64, 64),
              # D-FINE and DEIMv2 the same way: at 32 pixels the encoder's top map is 1 x 1,
              # and its bias gradients sum two +-1e17 values whose exact sum is ~16.
              # PP-DocLayoutV3 (the same backbone and encoder) too.
              "d_fine": (64, 64), "deimv2": (64, 64), "pp_doclayout_v3": (64, 64),
              # PP-OCRv6's detector fuses four stages (strides 4-32): 64 pixels keep 2 x 2 at the top.
              "pp_ocrv6_medium_det": (64, 64), "pp_ocrv6_small_det": (64, 64),
              # UVDoc strides 16 to its bridge, and its head pads 2 by reflection (less than
              # the map's side): 64 pixels keep 4 x 4.
              "uvdoc": (64, 64), **{t: (48, 64) for t in (
    "pp_ocrv6_small_rec", "pp_ocrv6_tiny_rec")}}
# Audio features several mel frames wide: Granite Speech 5 adds deltas (x 2) and stacks
# frame pairs (x 2) before its first linear layer.
MEL_STACK = {"granite_speech5_ctc": 4, "granite_speech5_encoder": 4}
# Feature frames for audio towers whose config holds no max_source_positions: Voxtral
# Realtime adds one audio embedding to each of the 8 tokens (64 frames / 8).
AUDIO_FRAMES = {"voxtral_realtime": 64}
# Granite Speech's input_features_mask selects projected audio features (one per
# placeholder token), not feature frames.
AUDIO_FEATURE_MASK = ("granite_speech", "granite_speech_plus")
# Task heads of encoder-decoders that pool the decoder at the end-of-sequence token.
POOL_AT_EOS = ("sequence_classification",)
# Base models of keypoint matchers: they take image pairs too.
IMAGE_PAIRS = ("efficientloftr",)
# Types whose forward only works on a batch of one (TVP views its column position table
# as (batch, 1, width, hidden)).
ONE_SAMPLE = {"tvp": 1}
# Types whose model class only generates (no forward of its own): the trainable part
# built instead, with its sub-config (Bark's semantic text-to-tokens model). SAM 2 Video's
# forward tracks through a stateful inference session under torch.inference_mode (no
# training step can run it): its per-frame image model, SAM 2's, from the same config
# (its mask-generation class; the memory modules run only inside that session).
PARTS = {"bark": "BarkSemanticModel", "sam2_video": "Sam2Model"}
# Per-stage lists of hierarchical models (ResNet, Swin, ...): same length, small values.
STAGE_LISTS = {"depths": 1, "hidden_sizes": 16, "embed_dims": 16, "num_heads": 2,
               "blocks_per_stage": 1, "embed_dim_per_stage": 32}  # Hiera: doubling from hidden_size
# Codec (DAC, X-Codec 2, VibeVoice) channel counts at the first stage, and code widths.
CODEC_WIDTHS = {"num_filters": 4, "encoder_hidden_size": 4, "decoder_hidden_size": 32,
                "quantization_dim": 32}
# Float fields whose names hold one of these draw random masks when the model trains.
RANDOM_MASKS = ("dropout", "drop_", "pdrop", "layerdrop", "mask_time_prob", "mask_feature_prob",
                "vae_std")  # VibeVoice's tokenizers add noise of this scale to their latents
# Other training-time randomness, turned off: Sapiens 2 shifts, jitters and rescales its
# patch positions.
RANDOM_OFF = {"pos_embed_shift": None, "pos_embed_jitter": None, "pos_embed_rescale": None}
SPECIAL_IDS = 16  # the top of the vocabulary, kept for special tokens
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
             "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id")


def head_mappings():
    from transformers.models.auto import modeling_auto
    return [(name, getattr(modeling_auto, attr), family) for name, attr, family in HEADS]


def model_types(archs=None) -> list:
    """Every model type with a model class (config-only types, such as the vision half of a
    multimodal config, are parts of the architectures they belong to)."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
    types = sorted(set(MODEL_MAPPING_NAMES) | {t for _, m, _ in head_mappings() for t in m})
    if archs:
        unknown = sorted(set(archs) - set(types))
        if unknown:
            raise ValueError(f"unknown model types: {', '.join(unknown)}")
        types = [t for t in types if t in archs]
    return types


def representative(model_type):
    """(head, family, class name) of the class the pipeline builds for a model type."""
    for head, mapping, family in head_mappings():
        if model_type in mapping:
            names = mapping[model_type]
            return head, family, names[0] if isinstance(names, (list, tuple)) else names
    return None, "other", None


# Fields that size a width: an unlisted field that held the same original value as one of
# these (a projector's input, a cross-attention's key width) follows it, so sub-configs agree.
WIDTHS = ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "d_embed", "emb_dim",
          "projection_dim", "text_embed_dim", "embedding_size", "word_embed_proj_dim",
          "out_hidden_size")
# (height, width) pairs: not one size per layer; the model's own geometry decides them.
SPATIAL = ("image_size", "patch_size")
SIZE_WORDS = ("size", "dim", "hidden", "channels", "width", "embed", "features")


def _configs(cfg, depth=0):
    """`cfg` and its sub-configs (three levels deep)."""
    from transformers import PretrainedConfig
    yield cfg
    if depth < 3:
        for value in list(vars(cfg).values()):
            if isinstance(value, PretrainedConfig):
                yield from _configs(value, depth + 1)


def _per_layer_pick(layer_types, n):
    """Indices of `n` or more layers that keep every distinct layer type (a hybrid model
    with only its first layers would lose its attention or its state-space layers)."""
    first = {}
    for i, t in enumerate(layer_types):
        first.setdefault(str(t), i)
    picks = sorted(first.values())
    for i in range(len(layer_types)):
        if len(picks) >= n:
            break
        if i not in picks:
            picks = sorted(picks + [i])
    return picks


def _shrink_one(cfg, widths):
    # Multi-head attention (and latent attention, which makes keys per head) stays so.
    mha = vars(cfg).get("num_key_value_heads") == vars(cfg).get("num_attention_heads")
    for key, value in list(vars(cfg).items()):
        if key in STAGE_LISTS and isinstance(value, (list, tuple)) and value:
            setattr(cfg, key, [STAGE_LISTS[key] * (1 if key in ("depths", "num_heads", "blocks_per_stage")
                                                   else 2 ** i if key == "embed_dim_per_stage" else i + 1)
                               for i in range(len(value))])
        elif key in SMALL and isinstance(SMALL[key], list) and isinstance(value, (list, tuple)):
            setattr(cfg, key, type(value)(SMALL[key]))
        elif key == "qk_rope_head_dim" and value == 0:
            pass  # latent attention without rotary keys (NoPE, as GLM-5-Next requires) stays so
        elif key in SMALL and type(value) is type(SMALL[key]) and value is not None:
            if key in WIDTHS and value > SMALL[key]:
                widths.setdefault(value, SMALL[key])
            setattr(cfg, key, SMALL[key])
        elif key in ("vocab_size", "num_experts_per_tok") and value is None:
            setattr(cfg, key, SMALL[key])  # left unset by the class default (ESM): no embedding without it
        elif key not in SMALL and "vocab" in key and type(value) is int and value > 4096:
            setattr(cfg, key, SMALL["vocab_size"])  # hashed or per-layer vocabularies
        elif (key in SMALL and isinstance(SMALL[key], int) and isinstance(value, (list, tuple))
              and value and all(type(v) is int for v in value) and key not in SPATIAL):
            setattr(cfg, key, [SMALL[key]] * len(value))  # one size per layer
    if "head_dim" in vars(cfg) and vars(cfg)["head_dim"] is None and isinstance(
            vars(cfg).get("num_attention_heads"), int) and isinstance(vars(cfg).get("hidden_size"), int):
        vars(cfg)["head_dim"] = cfg.hidden_size // cfg.num_attention_heads  # some models read it raw
    if mha and isinstance(vars(cfg).get("num_attention_heads"), int):
        cfg.num_key_value_heads = cfg.num_attention_heads
    # Hybrid stacks: keep each kind of layer, and every per-layer list in step with it.
    n_key = next((k for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
                  if isinstance(vars(cfg).get(k), int)), None)
    types_key = getattr(type(cfg), "attribute_map", {}).get("layer_types", "layer_types")
    types = vars(cfg).get(types_key)
    if n_key and isinstance(types, (list, tuple)) and types:
        old_n = len(types)
        picks = _per_layer_pick(list(types), getattr(cfg, n_key))
        for key, value in list(vars(cfg).items()):
            if isinstance(value, (list, tuple)) and len(value) == old_n and key != "id2label":
                setattr(cfg, key, [value[i] for i in picks])
        setattr(cfg, n_key, len(picks))
    n = getattr(cfg, n_key, 2) if n_key else 2
    if n_key and not isinstance(vars(cfg).get("depths"), list):  # (stages of layers: HGNetV2, ResNet)
        _fix_backbone_stages(cfg, n)
    for key, value in list(vars(cfg).items()):
        # "every k-th layer from offset j" patterns must still hit a layer of the small stack.
        if key.endswith("_layer_period") and isinstance(value, int) and value > n:
            setattr(cfg, key, n)
        elif key.endswith("_layer_offset") and isinstance(value, int) and value >= n:
            setattr(cfg, key, n - 1)
    # Derived head sizes (multi-head latent attention): rope part and query width.
    if isinstance(vars(cfg).get("qk_rope_head_dim"), int):
        if "head_dim" in vars(cfg):
            cfg.head_dim = cfg.qk_rope_head_dim
        if "qk_head_dim" in vars(cfg):
            cfg.qk_head_dim = cfg.qk_rope_head_dim + (getattr(cfg, "qk_nope_head_dim", 0) or 0)
    if isinstance(vars(cfg).get("rotary_dim"), int):
        cfg.rotary_dim = min(cfg.rotary_dim, 8)
    _fix_mrope(cfg)
    # Mamba-2 style mixers: heads x head size must equal the expanded width.
    v = vars(cfg)
    for exp_k, heads_k, dim_k in (("expand", "num_heads", "head_dim"),
                                  ("mamba_expand", "mamba_n_heads", "mamba_d_head")):
        if all(isinstance(v.get(k), int) for k in (exp_k, heads_k, dim_k, "hidden_size")):
            setattr(cfg, heads_k, max(1, v[exp_k] * cfg.hidden_size // v[dim_k]))
            if isinstance(v.get("mamba_d_ssm"), int):
                cfg.mamba_d_ssm = v[heads_k] * v[dim_k]
    if all(isinstance(vars(cfg).get(k), int) for k in ("window_size", "spatial_merge_size", "patch_size")):
        # Qwen2.5-VL style windows count merged patches: whole ones, two per side.
        cfg.window_size = 2 * cfg.patch_size * cfg.spatial_merge_size
    depths = vars(cfg).get("depths")
    if (isinstance(vars(cfg).get("window_size"), int) and isinstance(depths, list) and depths
            and isinstance(vars(cfg).get("patch_size"), int)):
        # Shifted-window stages: the last stage's grid must hold whole windows.
        cfg.image_size = 64
        cfg.window_size = max(1, 64 // (cfg.patch_size * 2 ** (len(depths) - 1)))
    if isinstance(vars(cfg).get("downsampling_ratios"), (list, tuple)):
        # Convolutional codecs double their channels at each downsampling stage.
        for key, most in CODEC_WIDTHS.items():
            if type(vars(cfg).get(key)) is int and vars(cfg)[key] > most:
                setattr(cfg, key, most)
    out = vars(cfg).get("stage_out_channels")
    sizes = vars(cfg).get("hidden_sizes")
    if isinstance(out, (list, tuple)) and isinstance(sizes, list) and len(out) == len(sizes):
        # HGNetV2 stages: each stage's input is the previous one's output, the first the stem's.
        stem = vars(cfg).get("stem_channels") or [16]
        cfg.stage_out_channels = list(sizes)
        cfg.stage_in_channels = [stem[-1]] + list(sizes[:-1])
        cfg.stage_mid_channels = [16] * len(sizes)
    for key in ("use_timm_backbone", "use_pretrained_backbone"):
        if vars(cfg).get(key):
            setattr(cfg, key, False)  # timm is not installed; the HF backbone is built instead


def _fix_backbone_stages(cfg, n):
    """A backbone with one stage per layer (LW-DETR's ViT) whose outputs point past the
    small stack: stage names for its n layers, and as many distinct in-range outputs as
    fit (the deepest ones)."""
    names, outs = vars(cfg).get("stage_names"), vars(cfg).get("_out_indices")
    if not (isinstance(names, list) and len(names) > n + 1 and names[0] == "stem"
            and isinstance(outs, list) and outs and all(type(i) is int and i >= 0 for i in outs)
            and max(outs) > n):
        return
    cfg.stage_names = names[:n + 1]
    picks = {min(i, n) for i in outs}
    for i in range(n, 0, -1):
        if len(picks) >= min(len(outs), n):
            break
        picks.add(i)
    cfg.out_indices = sorted(picks)


LAYER_INDEX_KEYS = ("vision_feature_layer", "vision_feature_layers", "intermediate_hook_ids",
                    "global_attn_indexes", "intermediate_layers_indices")  # (Mllama's vision tower)


def _clamp_layer_indices(cfg):
    """Hidden-state indices a head reads (LLaVA's feature layer, VipLlava's five, Depth
    Pro's hooks) point into the small stack: from the end as before, from the start at
    most at its last layer."""
    if not any(k in vars(cfg) for k in LAYER_INDEX_KEYS):
        return
    # The tower the indices point into: the vision sub-config, else the first with layers.
    towers = [vars(cfg).get("vision_config")] + list(_configs(cfg))[1:] + [cfg]
    n = next((vars(t)[k] for t in towers if t is not None for k in ("num_hidden_layers", "num_layers")
              if isinstance(vars(t).get(k), int)), None)
    if n is None:
        return
    fix = lambda i: max(i, -(n + 1)) if i < 0 else min(i, n - 1)  # noqa: E731
    for key in LAYER_INDEX_KEYS:
        value = vars(cfg).get(key)
        if type(value) is int:
            setattr(cfg, key, fix(value))
        elif isinstance(value, (list, tuple)) and all(type(i) is int for i in value):
            setattr(cfg, key, type(value)(fix(i) for i in value))


def _fix_mrope(cfg):
    """Multimodal rotary sections must add up to half the head size."""
    rope = vars(cfg).get("rope_parameters")
    wants = "mrope_section" in getattr(type(cfg), "ignore_keys_at_rope_validation", ())
    if not isinstance(rope, dict) or not (wants or "mrope_section" in rope):
        return
    heads = getattr(cfg, "num_attention_heads", None)
    hd = vars(cfg).get("head_dim") or (cfg.hidden_size // heads if heads else 16)
    old = rope.get("mrope_section") or [8, 12, 12]
    factor = rope.get("partial_rotary_factor") or vars(cfg).get("partial_rotary_factor") or 1.0
    half, total = int(hd * factor) // 2, sum(old)
    sec = [max(1, v * half // total) for v in old]
    sec[-1] += half - sum(sec)
    rope["mrope_section"] = sec


def _follow_widths(cfg, widths):
    """Unlisted size fields that held a shrunk width's original value take its new value."""
    for key, value in list(vars(cfg).items()):
        if (type(value) is int and key not in SMALL and value in widths
                and any(w in key for w in SIZE_WORDS) and not key.startswith("num_")):
            setattr(cfg, key, widths[value])


def _fix_backbone_channels(cfg):
    """Detection heads over a backbone (RT-DETR, D-FINE): the encoder takes the shrunk
    backbone's channels at its output stages, the decoder the encoder's width."""
    bb, v = vars(cfg).get("backbone_config"), vars(cfg)
    sizes = getattr(bb, "hidden_sizes", None)
    outs = getattr(bb, "out_indices", None)
    enc = v.get("encoder_in_channels")
    if isinstance(sizes, (list, tuple)) and outs and isinstance(enc, (list, tuple)) and len(enc) == len(outs):
        cfg.encoder_in_channels = [sizes[i - 1] for i in outs]
    elif isinstance(sizes, (list, tuple)) and outs and isinstance(v.get("x4_feat_dim"), int):
        # PP-DocLayoutV3 takes the first output stage apart (stride 4, for its masks).
        cfg.x4_feat_dim = sizes[outs[0] - 1]
        if isinstance(enc, (list, tuple)) and len(enc) == len(outs) - 1:
            cfg.encoder_in_channels = [sizes[i - 1] for i in outs[1:]]
    stages = getattr(bb, "embed_dim_per_stage", None)
    if isinstance(stages, list) and isinstance(v.get("backbone_channel_list"), list):
        cfg.backbone_channel_list = stages[::-1]  # SAM2's neck: the Hiera stages, deepest first
    dec, width = v.get("decoder_in_channels"), v.get("encoder_hidden_dim")
    if isinstance(dec, (list, tuple)) and isinstance(width, int):
        cfg.decoder_in_channels = [width] * len(dec)


def _rederive(cfg, old):
    """Fields a config's own __post_init__ derived from shrunk ones (Zamba's attention width
    = 2 x hidden size, a head size = width / heads) take the value the shrunk inputs give:
    a field counts as derived when the class computes a different value for it from the
    shrunk inputs than from its defaults, and the shrinking left it alone."""
    from transformers import PretrainedConfig
    changed = {k: v for k, v in vars(cfg).items()
               if not k.startswith("_") and not isinstance(v, PretrainedConfig)
               and (k not in old or not _same(old[k], v))}
    subs = {k: copy.deepcopy(v) for k, v in vars(cfg).items()
            if not k.startswith("_") and isinstance(v, PretrainedConfig)}
    if not changed and not subs:
        return
    try:
        base = type(cfg)()
    except Exception:  # noqa: BLE001 -- the class cannot be made alone: keep what we have
        return
    # The shrunk sub-configs go in too: a field derived from one (MiniMax-M3-VL's merged
    # width = the text tower's width x merge^2) follows it.
    small = None
    # Per-layer lists the class validates against the layer count are left out on a retry.
    for args in ({**changed, **subs}, changed,
                 {k: v for k, v in changed.items() if not isinstance(v, (list, tuple, dict))}):
        try:
            small = type(cfg)(**args)
            break
        except Exception:  # noqa: BLE001
            continue
    if small is None:
        return
    for key, value in list(vars(cfg).items()):
        if key in changed or key.startswith("_") or isinstance(value, PretrainedConfig):
            continue
        derived = vars(small).get(key, value)
        if not _same(vars(base).get(key), derived) and key in old and _same(old[key], value):
            setattr(cfg, key, derived)


def _same(a, b):
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 -- tensors, odd objects: treat as different
        return a is b


def shrink(cfg, overrides=None):
    """Sets every known size field of `cfg` (and its sub-configs) to a small value, keeping
    the fields that must agree with each other in agreement; `overrides` (a FAMILY entry)
    are set before derived fields are re-derived."""
    widths = {}
    nodes = list(_configs(cfg))
    before = [dict(vars(node)) for node in nodes]
    for node in nodes:
        _shrink_one(node, widths)
    _follow_concatenated_widths(nodes, before)
    _match_codec_hops(nodes)
    _override(cfg, overrides)
    for node, old in zip(nodes, before):
        _rederive(node, old)
    moved = {}
    for node in nodes:
        _clamp_layer_indices(node)
        _follow_widths(node, widths)
        _fix_backbone_channels(node)
        _fix_token_ids(node, moved)
        if "use_cache" in vars(node):
            node.use_cache = False  # a training step keeps no cache (state-space stacks have none)
    _override(cfg, overrides)  # again: width following must not undo an override
    return cfg


def _follow_concatenated_widths(nodes, before):
    """A size field that held the sum of a config's width and a sub-config's (X-Codec 2's
    quantizer width = acoustic + semantic widths, the two concatenated) takes the sum of
    their shrunk widths."""
    old_of = {id(n): o for n, o in zip(nodes, before)}
    for node, old in zip(nodes, before):
        w0 = old.get("hidden_size")
        for sub in [v for v in vars(node).values() if id(v) in old_of and v is not node]:
            s0 = old_of[id(sub)].get("hidden_size")
            if not (type(w0) is int and type(s0) is int and isinstance(vars(sub).get("hidden_size"), int)):
                continue
            for key, value in old.items():
                if (type(value) is int and value == w0 + s0 and key != "hidden_size"
                        and any(w in key for w in SIZE_WORDS) and not key.startswith("num_")):
                    setattr(node, key, node.hidden_size + sub.hidden_size)


def _match_codec_hops(nodes):
    """A codec that pairs a speech encoder's features (HuBERT's strided convolutions) with
    an acoustic encoder's (downsampling_ratios), frame by frame (X-Codec): the small
    feature extractor strides as the acoustic one does, one layer per ratio."""
    from transformers import PretrainedConfig
    for node in nodes:
        subs = [v for v in vars(node).values() if isinstance(v, PretrainedConfig)]
        ratios = next((list(vars(s)["downsampling_ratios"]) for s in subs
                       if isinstance(vars(s).get("downsampling_ratios"), (list, tuple))), None)
        for sub in subs:
            if ratios and isinstance(vars(sub).get("conv_stride"), (list, tuple)):
                sub.conv_stride = list(ratios)
                sub.conv_kernel = list(ratios)  # windows side by side: one frame per hop
                sub.conv_dim = [SMALL["conv_dim"][0]] * len(ratios)
                sub.num_feat_extract_layers = len(ratios)


def _override(cfg, overrides):
    for key, value in (overrides or {}).items():
        *path, field = key.split(".")
        node = cfg
        for name in path:
            node = getattr(node, name)
        sub = getattr(type(node), "sub_configs", {}).get(field)
        if isinstance(value, dict) and isinstance(sub, type):
            # A sub-config given as a dict is made through its class: its __post_init__
            # derives the fields it fills from the ones given (Sapiens 2's kernel lists);
            # an AutoConfig slot names its model type.
            value = (sub.for_model(**value) if hasattr(sub, "for_model") else sub(**value))
        setattr(node, field, value)


def _fix_token_ids(cfg, moved):
    """Special token ids (text, image, audio placeholders) inside the small vocabulary, at
    its top, where the random input ids never land. `moved` maps the ids of configs done
    before to their new values: a sub-config's id equal to its parent's (T5Gemma 2's image
    token, in the top config and the encoder's) stays equal."""
    vocab = getattr(cfg, "vocab_size", None)
    if not isinstance(vocab, int):
        vocab = getattr(vars(cfg).get("text_config"), "vocab_size", None)
    if isinstance(vocab, int):
        top = vocab - 1
        local, used = {}, set(moved.values())
        for key, tower in (("image_token_id", "vision_config"), ("image_token_index", "vision_config"),
                           ("audio_token_id", "audio_config"), ("video_token_index", "vision_config")):
            if key in vars(cfg) and vars(cfg)[key] is None and tower in vars(cfg):
                setattr(cfg, key, vocab)  # unset in the class default; moved into range below
        for key, tid in list(vars(cfg).items()):
            special = key in TOKEN_IDS or key.endswith(("_token_id", "_token_index"))
            if special and type(tid) is int and tid >= vocab - SPECIAL_IDS:
                if key == "pad_token_id":
                    setattr(cfg, key, 1)
                elif tid in moved and moved[tid] < vocab:
                    setattr(cfg, key, moved[tid])
                else:
                    while top in used:
                        top -= 1
                    setattr(cfg, key, top)
                    local.setdefault(tid, top)
                    top -= 1
        for tid, new in local.items():
            moved.setdefault(tid, new)
    if getattr(cfg, "is_encoder_decoder", False) and getattr(cfg, "decoder_start_token_id", None) is None:
        cfg.decoder_start_token_id = getattr(cfg, "pad_token_id", None) or 0
    for key, value in list(vars(cfg).items()):
        # Random masks (dropout, layer drop, SpecAugment) cannot match CPU's draws.
        if isinstance(value, float) and any(w in key for w in RANDOM_MASKS):
            setattr(cfg, key, 0.0)
        elif (isinstance(value, (list, tuple)) and value and all(isinstance(v, float) for v in value)
              and any(w in key for w in RANDOM_MASKS)):
            setattr(cfg, key, type(value)(0.0 for _ in value))  # per stage (CvT's drop_path_rate)
        elif key in RANDOM_OFF:
            setattr(cfg, key, RANDOM_OFF[key])


def model_class(model_type, cls_name):
    """The class `cls_name` from transformers' top level, else from the model type's own
    modeling module: a few classes the auto mappings name are not exported (Voxtral
    Realtime's text model)."""
    import importlib
    import transformers
    try:
        return getattr(transformers, cls_name)
    except AttributeError:
        from transformers.models.auto.configuration_auto import model_type_to_module_name
        name = model_type_to_module_name(model_type)
        return getattr(importlib.import_module(f"transformers.models.{name}.modeling_{name}"), cls_name)


def build(model_type, head=None):
    """(model on CPU in train mode, config, head, family, class name); raises when no
    small valid config can be made. `head` (a stage-2 task head, see sample.py) picks the
    class of that head instead of the representative one."""
    import transformers
    if head is None:
        head, family, cls_name = representative(model_type)
        cls_name = PARTS.get(model_type, cls_name)
    else:
        from torch_tpu.compat import sample
        family = representative(model_type)[1]
        cls_name = sample.class_of(head, model_type)
    if cls_name is None:
        raise LookupError("no model class for this type")
    if model_type in COMPOSITE:
        cfg = _composite(model_type)
    elif model_type in PARTS_OF:
        # Every sub-config given (the strict class validates each at init): the named
        # types' defaults in the AutoConfig slots, its own classes' defaults in the others.
        cls = transformers.models.auto.configuration_auto.CONFIG_MAPPING[model_type]
        cfg = cls(**{k: transformers.AutoConfig.for_model(PARTS_OF[model_type][k]) if k in PARTS_OF[model_type]
                     else sub() for k, sub in cls.sub_configs.items()})
    else:
        cfg = transformers.AutoConfig.for_model(model_type, **INIT.get(model_type, {}))
    timm = getattr(cfg, "backbone_config", None)
    if type(timm).__name__.startswith("Timm"):
        # timm is not installed: the same stages from the Hugging Face ResNet instead.
        out = list(getattr(timm, "out_indices", None) or [4])
        cfg = transformers.AutoConfig.for_model(
            model_type, backbone_config=transformers.ResNetConfig(out_indices=out))
    cfg = shrink(cfg, FAMILY.get(model_type))
    if head == "sequence_classification" and getattr(cfg, "pad_token_id", 0) is None:
        cfg.pad_token_id = 1  # decoders pool the last non-pad token: batches need a pad id
    cls = model_class(model_type, cls_name)
    cfg = _config_for(cls, cfg)
    _tie_needs_two_layers(cls, cfg)
    torch.manual_seed(0)
    model = cls(cfg)
    _redraw_constant_weights(model)
    for m in model.modules():  # rates some models read from dicts the config loop misses
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
    n = sum(p.numel() for p in model.parameters())
    if n > 20_000_000:
        raise ValueError(f"the shrunk model still has {n / 1e6:.0f}M parameters")
    return model, cfg, head, family, cls_name


def _composite(model_type):
    """An encoder-decoder (or dual encoder) config from two small standard configs, as
    users pair pretrained checkpoints."""
    import transformers
    a, b = (transformers.AutoConfig.for_model(t) for t in COMPOSITE[model_type])
    cls = transformers.models.auto.configuration_auto.CONFIG_MAPPING[model_type]
    if model_type == "vision-text-dual-encoder":
        return cls.from_vision_text_configs(a, b)
    cfg = cls.from_encoder_decoder_configs(a, b)
    cfg.pad_token_id, cfg.decoder_start_token_id = 1, 2  # labels are shifted into decoder inputs
    return cfg


def _config_for(cls, cfg):
    """The config `cls` takes: a text-only head of a multimodal type (Emu3ForCausalLM,
    Llama4ForCausalLM) is built from the matching sub-config, as its checkpoints are."""
    want = getattr(cls, "config_class", None)
    if want is None or isinstance(cfg, want):
        return cfg
    sub = next((c for c in _configs(cfg) if isinstance(c, want)), None)
    return sub if sub is not None else cfg


def _tie_needs_two_layers(cls, cfg):
    r"""Detection heads that tie every later decoder layer's prediction head to layer 0's
    (a `(?![0])\d+` pattern in _tied_weights_keys, Grounding DINO's) refuse to build when
    the pattern matches no layer: such a class gets a second decoder layer."""
    ties = getattr(cls, "_tied_weights_keys", None) or {}
    if not any("(?![0])" in k for k in ties):
        return
    for key in ("decoder_layers", "num_decoder_layers"):
        if vars(cfg).get(key) == 1:
            setattr(cfg, key, 2)


def _redraw_constant_weights(model):
    """Weights of two or more dimensions that start constant (zero-initialized query tokens,
    zero output projections) get small random values: a constant row through a LayerNorm
    with eps 1e-12 multiplies rounding noise by 1e6 in its gradient (InstructBLIP's query
    tokens), and zeros hide wrong values. Checkpoints never hold such weights."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and p.is_floating_point() and p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.02)


def _sub(cfg, *names):
    for n in names:
        sub = getattr(cfg, n, None)
        if sub is not None:
            return sub
    return cfg


def inputs(model, cfg, head, batch=2, seq=8):
    """Keyword inputs for `model.forward`, by the names its signature takes."""
    params = dict(inspect.signature(model.forward).parameters)
    # A tower whose sub-config is unset is not built (Gemma 4's default is text only):
    # nothing to give it.
    absent = {k for k in ("vision_config", "audio_config") if k in vars(cfg) and vars(cfg)[k] is None}
    for name in list(params):
        if ("vision_config" in absent and name.startswith(("pixel_values", "image_", "video_"))
                or "audio_config" in absent and name.startswith(("input_features", "input_values", "audio_"))):
            del params[name]
    batch = ONE_SAMPLE.get(getattr(cfg, "model_type", None), batch)
    g = torch.Generator().manual_seed(0)
    text = _sub(cfg, "text_config")
    vocab = getattr(text, "vocab_size", None) or 128
    kw = {}
    ids = torch.randint(3, max(4, min(vocab, 128) - SPECIAL_IDS), (batch, seq), generator=g)
    # Placeholder ids a config keeps inside the random range (EXAONE 4.5's image token, 67)
    # would count as images: such draws take the first id that is none of them.
    marks = sorted({v for c in _configs(cfg) for k, v in vars(c).items()
                    if k.endswith(("_token_id", "_token_index")) and k not in TOKEN_IDS and type(v) is int})
    if marks:
        safe = next(i for i in range(3, 3 + len(marks) + 1) if i not in marks)
        ids[torch.isin(ids, torch.tensor(marks))] = safe
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, -2:] = 0  # one padded row
    # Speech and image heads read ids only when they have no pixels or audio to read
    # (ImageGPT classifies token ids of colour clusters; Dia encodes a text prompt).
    media = {"pixel_values", "input_features", "input_values"} & set(params)
    vlm = "text_config" in vars(cfg) and (_image_token(cfg) is not None or _image_token(cfg, "audio") is not None)
    if vlm:
        # A language model reads them beside its pixels (ShieldGemma 2) or its audio
        # (VibeVoice, Fun-ASR-Nano: placeholders in the text).
        media = set()
    if "input_ids" in params and (not media or head not in (
            "speech_seq2seq", "ctc", "audio_classification", "image_classification")):
        kw["input_ids"] = ids
        if "attention_mask" in params:
            kw["attention_mask"] = mask
    if head == "multiple_choice" and "input_ids" in kw:
        # (batch, choices, seq): two choices per example.
        for k in ("input_ids", "attention_mask"):
            if k in kw:
                kw[k] = torch.stack([kw[k], kw[k].flip(0)], dim=1)
    if "pixel_values" in params:
        vis = _sub(cfg, "vision_config")
        # (SAM 2's vision config keeps its size in the backbone's config.)
        size = INPUT_SIZE.get(getattr(cfg, "model_type", None)) or getattr(vis, "image_size", None) or getattr(
            getattr(vis, "backbone_config", None), "image_size", None) or 32
        h, w = size[:2] if isinstance(size, (list, tuple)) else (size, size)  # MGP-STR: 32 x 128
        kw["pixel_values"] = torch.randn(batch, getattr(vis, "num_channels", 3), h, w, generator=g)
        frames = next((vars(c)["num_frames"] for c in _configs(cfg)
                       if isinstance(vars(c).get("num_frames"), int)), None)
        if type(model).__name__.endswith("ForKeypointMatching") or getattr(cfg, "model_type", "") in IMAGE_PAIRS:
            # Matchers (LightGlue, EfficientLoFTR) take image pairs: (batch, 2, channels, h, w).
            kw["pixel_values"] = torch.randn(batch, 2, *kw["pixel_values"].shape[1:], generator=g)
        elif frames:  # video models: (batch, frames, channels, height, width)
            video = torch.randn(batch, frames, *kw["pixel_values"].shape[1:], generator=g)
            kw["pixel_values"] = _probe(model, kw, "pixel_values", (video, kw["pixel_values"]))
        tiles = getattr(vis, "max_num_tiles", None)
        if "aspect_ratio_ids" in params and isinstance(tiles, int):
            # Tiled towers (Mllama): (batch, images, tiles, channels, h, w), one image per
            # sample, padded to max_num_tiles; each image's layout is an id into the
            # supported aspect ratios (offset by one: 0 is padding) and a mask of its real
            # tiles: a 1 x 2 image, then a 1 x 1.
            ratios = getattr(vis, "supported_aspect_ratios", None) or [[1, 1]]
            layouts = [next((i for i, r in enumerate(ratios) if list(r) == want), 0) for want in ([1, 2], [1, 1])]
            layouts = [layouts[i % 2] for i in range(batch)]
            kw["pixel_values"] = torch.randn(batch, 1, tiles, *kw["pixel_values"].shape[1:], generator=g)
            kw["aspect_ratio_ids"] = torch.tensor([[i + 1] for i in layouts])
            kw["aspect_ratio_mask"] = torch.tensor(
                [[[int(t < ratios[i][0] * ratios[i][1]) for t in range(tiles)]] for i in layouts])
    if "spatial_shapes" in params and "pixel_values" in kw:
        # NaFlex towers (SigLIP 2): a 4 x 4 grid of flattened patches, all real (made before
        # image tokens are counted: LFM2-VL counts them from these).
        vis = _sub(cfg, "vision_config")
        p = getattr(vis, "patch_size", 4) or 4
        c = getattr(vis, "num_channels", 3) or 3
        kw.update(pixel_values=torch.randn(batch, 16, c * p * p, generator=g),
                  pixel_attention_mask=torch.ones(batch, 16, dtype=torch.long),
                  spatial_shapes=torch.tensor([[4, 4]] * batch))
    pos_name = next((n for n in ("pixel_position_ids", "image_position_ids") if n in params), None)
    if pos_name and "pixel_values" in kw and "spatial_shapes" not in params:
        # Towers that take flattened patches with their (x, y) grid positions (Gemma 4's):
        # a square grid of 2 x 2 pooling windows.
        vis = _sub(cfg, "vision_config")
        p = getattr(vis, "patch_size", 4) or 4
        c = getattr(vis, "num_channels", 3) or 3
        side = 2 * (getattr(vis, "pooling_kernel_size", 1) or 1)
        idx = torch.arange(side * side)
        kw["pixel_values"] = torch.randn(batch, side * side, c * p * p, generator=g)
        kw[pos_name] = torch.stack([idx % side, idx // side], dim=-1).expand(batch, -1, -1).contiguous()
    if "image_sizes" in params and "pixel_values" in kw and isinstance(vars(cfg).get("image_grid_pinpoints"), list):
        # LLaVA-NeXT's any-resolution grid (shrunk to one tile of the tower's size): each
        # image is its resized base view plus that one tile.
        pv = kw["pixel_values"]
        h, w = pv.shape[-2:]
        cfg.image_grid_pinpoints = [[h, w]]
        kw["pixel_values"] = torch.stack([pv, pv.flip(-1)], dim=1)
        kw["image_sizes"] = torch.tensor([[h, w]] * batch)
    if "high_res_pixel_values" in params and "pixel_values" in kw:
        # DeepSeek-VL hybrid: images for its high-resolution (SAM) tower too.
        hi = getattr(getattr(cfg, "high_res_vision_config", None), "image_size", 32)
        hi = hi[0] if isinstance(hi, (list, tuple)) else hi
        kw["high_res_pixel_values"] = torch.randn(batch, 3, hi, hi, generator=g)
    if "target_sizes" in params and "pixel_values" in kw and kw["pixel_values"].dim() == 4:
        # MiniCPM-V 4.6: every image's patches packed in one row, (1, channels, patch,
        # patches x patch), with each image's patch grid (rows, columns).
        p = getattr(_sub(cfg, "vision_config"), "patch_size", 4) or 4
        c, h, w = kw["pixel_values"].shape[-3:]
        kw["pixel_values"] = torch.randn(1, c, p, batch * (h // p) * (w // p) * p, generator=g)
        kw["target_sizes"] = torch.tensor([[h // p, w // p]] * batch, dtype=torch.int32)
    tower = next((getattr(m, n) for m in (model, getattr(model, "model", None))
                  for n in ("vision_tower", "vision_encoder") if hasattr(m, n)), None)
    if "image_sizes" in params and "pixel_values" in kw and hasattr(tower, "patch_size"):
        # Any-resolution towers (Pixtral's) cut each image by its original (height, width);
        # a fixed-size tower (CLIP in LLaVA) takes none.
        h, w = kw["pixel_values"].shape[-2:]
        kw["image_sizes"] = torch.tensor([[h, w]] * batch)
    for grid_name in ("grid_thw", "image_grid_thw", "image_grid_hw"):
        if grid_name in params:
            into = "hidden_states" if "hidden_states" in params else "pixel_values"
            if into in params:
                rows, grid = _flat_patches(_sub(cfg, "vision_config"), batch, g)
                # (Nemotron-H Omni's grids are (height, width): no frames.)
                kw[grid_name] = grid[:, 1:].contiguous() if grid_name.endswith("_hw") else grid
                if grid_name == "image_grid_thw" and "images_per_sample" in params:
                    # Image-to-image generators (GLM-Image): each sample's source image
                    # grid, then the grid of the image it generates (no pixels).
                    kw[grid_name] = torch.stack([grid, grid], dim=1).flatten(0, 1)
                    kw["images_per_sample"] = torch.tensor([2] * batch)
                merge_name = grid_name.replace("grid_thw", "merge_sizes")
                if merge_name in params and merge_name != grid_name:  # VideoLLaMA 3: each image's spatial merge (its tower's)
                    merge = getattr(_sub(cfg, "vision_config"), "spatial_merge_size", 2) or 2
                    kw[merge_name] = torch.tensor([merge] * batch)
                p = int((rows.shape[1] // 3) ** 0.5)
                # Rows of flat values, or of (channels, patch, patch) images.
                cands = (rows, rows.view(rows.shape[0], 3, p, p)) if 3 * p * p == rows.shape[1] else (rows,)
                kw[into] = _probe(model, kw, into, cands) if "input_ids" not in kw else rows
    if "qformer_input_ids" in params:  # before the image features are counted: they take it
        kw["qformer_input_ids"] = ids
        if "qformer_attention_mask" in params:
            kw["qformer_attention_mask"] = mask
    if "pixel_values" in kw and "input_ids" in kw:
        # Video-language models (InstructBLIP-Video) count video tokens instead.
        kind = "video" if _image_token(cfg) is None and _image_token(cfg, "video") is not None else "image"
        ids = _with_image_tokens(model, cfg, kw, ids, kind)
        kw["input_ids"] = ids
        if "attention_mask" in kw:
            kw["attention_mask"] = torch.cat([torch.ones(batch, ids.shape[1] - seq, dtype=torch.long),
                                              mask], dim=1)
    if "image_embeds_position_mask" in params and "pixel_values" in kw and "input_ids" in kw:
        # Kosmos-2: latent_query_num image positions ahead of the text, marked by a mask.
        n = cfg.latent_query_num
        kw["input_ids"] = torch.cat([torch.full((batch, n), 3, dtype=ids.dtype), kw["input_ids"]], dim=1)
        kw["image_embeds_position_mask"] = torch.cat(
            [torch.ones(batch, n, dtype=torch.long), torch.zeros(batch, seq, dtype=torch.long)], dim=1)
        if "attention_mask" in kw:
            kw["attention_mask"] = torch.cat([torch.ones(batch, n, dtype=torch.long), mask], dim=1)
    if "mm_token_type_ids" in params and "input_ids" in kw:
        tok = _image_token(cfg)
        kw["mm_token_type_ids"] = (kw["input_ids"] == tok).long() if tok is not None else \
            torch.zeros_like(kw["input_ids"])
    if "input_features" in params:
        audio = _sub(cfg, "audio_config", "encoder_config")
        frames = AUDIO_FRAMES.get(cfg.model_type) or 2 * getattr(audio, "max_source_positions", 16)
        kw["input_features"] = torch.randn(batch, _mel_bins(cfg), frames, generator=g)
        feature_frames = frames  # (the layout may change below)
    if "input_values" in params:
        kw["input_values"] = torch.randn(batch, 800, generator=g)
        frames = getattr(cfg, "max_length", 64)
        frames = frames if isinstance(frames, int) and frames <= 1024 else 64
        spectrogram = torch.randn(batch, frames, getattr(cfg, "num_mel_bins", 16), generator=g)
        # Codecs take (batch, 1, samples), at least one frame of their total hop (3200 here).
        long = torch.randn(batch, 1, 3200, generator=g)
        probe_kw = dict(kw)
        if "decoder_input_ids" in params and getattr(cfg, "is_encoder_decoder", False):
            probe_kw["decoder_input_ids"] = ids[:, :6]  # an encoder-decoder runs none without
        get = _features_getter(model, "audio", named=True)
        mask_param = inspect.signature(get).parameters.get("padding_mask") if get is not None else None
        needs_mask = "padding_mask" in params and mask_param is not None and \
            mask_param.default is inspect.Parameter.empty
        # An audio-language model that counts its audio tokens from a padding mask over the
        # samples (VibeVoice): all real, as long as the waveform tried.
        with_mask = (lambda c: {"padding_mask": torch.ones(batch, c.shape[-1], dtype=torch.bool)}) \
            if needs_mask else None
        target = model
        if get is not None and "input_ids" in kw and _image_token(cfg, "audio") is not None:
            # An audio-language model runs only with as many placeholders as audio features:
            # its audio tower alone is tried (the placeholders are counted below).
            takes = inspect.signature(get).parameters
            target = lambda **k: get(**{n: v for n, v in k.items() if n in takes})  # noqa: E731
        cands = (kw["input_values"], spectrogram, kw["input_values"].unsqueeze(1), long,
                 long.squeeze(1),  # a longer waveform (Moonshine Streaming's strided stem)
                 torch.randn(batch, 16000, generator=g))  # a second (Moonshine's)
        feats = kw.get("input_features")
        hop = getattr(cfg, "hop_length", None)
        if feats is not None and isinstance(hop, int) and hop * feats.shape[-1] <= 64000:
            # A codec that encodes a waveform beside its features (X-Codec 2): one hop of
            # samples per feature frame (the features are made (batch, bins, frames)).
            cands += (torch.randn(batch, 1, hop * feats.shape[-1], generator=g),)
        # A codec that takes both a waveform and its features (X-Codec 2's semantic branch)
        # needs both layouts right at once: each feature layout is tried with each waveform.
        layouts = (feats, feats.transpose(1, 2).contiguous()) if (
            feats is not None and feats.dim() == 3 and params["input_features"].default is inspect.Parameter.empty) \
            else (feats,)
        for feats in layouts:
            if feats is not None:
                probe_kw["input_features"] = feats
            got = _first_working(target, probe_kw, "input_values", cands, with_mask)
            if got is not None:
                if feats is not None:
                    kw["input_features"] = feats
                break
        kw["input_values"] = cands[0] if got is None else got
        if with_mask:
            kw.update(with_mask(kw["input_values"]))
        if "sample" in params and params["sample"].default is True:
            kw["sample"] = False  # a VAE's latent draw (VibeVoice) would differ from CPU's
    for name in params:
        # Audio-language models: which feature frames are real.
        if name in ("input_features_mask", "feature_attention_mask") and "input_features" in kw:
            kw[name] = torch.ones(batch, feature_frames, dtype=torch.long)
    codec = next((m for m in model.modules() if hasattr(m, "get_encoded_length")), None)
    tok = _image_token(cfg, "audio")
    if "input_values_cutoffs" in params and "input_ids" in kw and codec is not None and tok is not None:
        # A conversational speech model that encodes its audio prompt with its codec (CSM):
        # one waveform per sample, its end as the cutoff, one placeholder per codec frame.
        n = 3200
        frames = int(codec.get_encoded_length(torch.tensor([n]))[0])
        kw["input_values"] = torch.randn(batch, 1, n, generator=g)
        kw["input_values_cutoffs"] = torch.tensor([[n]] * batch)
        kw["input_ids"] = ids = torch.cat([torch.full((batch, frames), tok, dtype=ids.dtype), kw["input_ids"]], dim=1)
        if "attention_mask" in kw:
            kw["attention_mask"] = torch.cat([torch.ones(batch, frames, dtype=torch.long), kw["attention_mask"]], dim=1)
        seq = ids.shape[1]
    audio_key = next((k for k in ("input_features", "input_values") if k in kw), None)
    if audio_key and "input_ids" in kw and _image_token(cfg, "audio") is not None:
        ids = kw["input_ids"]
        new = _with_image_tokens(model, cfg, kw, ids, "audio", audio_key)
        if new.shape[1] != ids.shape[1]:
            kw["input_ids"] = new
            if cfg.model_type in AUDIO_FEATURE_MASK:
                kw["input_features_mask"] = torch.ones(batch, new.shape[1] - ids.shape[1], dtype=torch.bool)
            if "attention_mask" in kw:
                kw["attention_mask"] = torch.cat(
                    [torch.ones(batch, new.shape[1] - ids.shape[1], dtype=torch.long),
                     kw["attention_mask"]], dim=1)
            ids, seq = new, new.shape[1]
    if "past_values" in params:
        kw.update(_series(cfg, params, batch, g))
        if "past_values" not in kw:
            kw.update(_patched_series(model, cfg, params, batch, g))
    kw.update(_named_inputs(model, cfg, params, kw, batch, seq, g))
    if "pixel_values_videos" in kw and "input_ids" in kw and "pixel_values" not in kw:
        # Video-language models given a video alone (Video-LLaVA): one placeholder per
        # video feature.
        new = _with_image_tokens(model, cfg, kw, kw["input_ids"], "video", "pixel_values_videos")
        if new.shape[1] != kw["input_ids"].shape[1]:
            if "attention_mask" in kw:
                kw["attention_mask"] = torch.cat([torch.ones(batch, new.shape[1] - kw["input_ids"].shape[1],
                                                             dtype=torch.long), kw["attention_mask"]], dim=1)
            kw["input_ids"] = ids = new
    if "use_cache" in params:
        kw["use_cache"] = False  # a training step keeps no cache (state-space-only stacks have none)
    seq2seq = getattr(cfg, "is_encoder_decoder", False)
    if seq2seq and head in POOL_AT_EOS and "input_ids" in kw and isinstance(getattr(cfg, "eos_token_id", None), int):
        # BART-style classifiers read the decoder at each row's end-of-sequence token and
        # derive the decoder inputs from input_ids: one eos per row, at its last real token.
        ids = kw["input_ids"] = kw["input_ids"].clone()
        last = kw["attention_mask"].sum(1) - 1 if "attention_mask" in kw else torch.full((batch,), seq - 1)
        ids[torch.arange(batch), last] = cfg.eos_token_id
    elif "decoder_input_ids" in params and seq2seq:
        kw["decoder_input_ids"] = ids[:, :6].contiguous()
    if "labels" in params:
        if head in ("causal_lm", "masked_lm") and not ("decoder_input_ids" in kw and seq2seq):
            kw["labels"] = ids
        elif head in ("seq2seq_lm", "speech_seq2seq") and "input_ids" in kw and not getattr(
                cfg, "is_encoder_decoder", False):
            kw["labels"] = kw["input_ids"].clone()  # a decoder-only LM (audio LLMs): labels align with ids
        elif head in ("seq2seq_lm", "speech_seq2seq", "masked_lm") or (
                head == "visual_question_answering" and "decoder_input_ids" in params):
            # (An encoder-decoder's masked-LM head and BLIP's answer decoder: target ids.)
            kw["labels"] = ids[:, :6].contiguous()
            # Decoder inputs given (teacher forcing): not every model derives them from labels.
        elif head == "multiple_choice":
            kw["labels"] = torch.randint(0, 2, (batch,), generator=g)
        elif head in ("sequence_classification", "image_classification", "audio_classification",
                      "video_classification") and not vlm:
            # (A language model that classifies, ShieldGemma 2, scores tokens: no class labels.)
            kw["labels"] = torch.randint(0, getattr(cfg, "num_labels", 2), (batch,), generator=g)
    delays, dec = getattr(cfg, "delay_pattern", None), getattr(cfg, "decoder_config", None)
    if isinstance(delays, (list, tuple)) and "decoder_input_ids" in kw and isinstance(getattr(dec, "vocab_size", None), int):
        # A multi-codebook audio decoder (Dia): one code per channel and step, as
        # (batch, steps, channels), its labels channel-major, (batch x channels, steps).
        # (The flat (batch x channels, steps) input form views a transposed tensor.)
        top = max(4, dec.vocab_size - SPECIAL_IDS)
        steps, c = kw["decoder_input_ids"].shape[1], getattr(dec, "num_channels", None) or len(delays)
        kw["decoder_input_ids"] = torch.randint(0, top, (batch, steps, c), generator=g)
        if "labels" in kw:
            kw["labels"] = torch.randint(0, top, (batch * c, steps), generator=g)
    dec = vars(cfg).get("decoder") if hasattr(vars(cfg).get("decoder"), "model_type") else cfg
    if getattr(dec, "model_type", None) in FLAT_CODES:
        # MusicGen's decoder reads one row of codes per sample and codebook, (batch x
        # codebooks, steps), its labels (batch, steps, codebooks); given its codes, the
        # full model never reads an audio prompt.
        key = "decoder_input_ids" if "decoder_input_ids" in kw else "input_ids"
        top, c = max(4, dec.vocab_size - SPECIAL_IDS), dec.num_codebooks
        kw[key] = torch.randint(0, top, (batch * c, 6), generator=g)
        if key == "input_ids" and "attention_mask" in kw:
            kw["attention_mask"] = torch.ones(batch * c, 6, dtype=torch.long)
        if "labels" in params:
            kw["labels"] = torch.randint(0, top, (batch, 6, c), generator=g)
        kw.pop("input_values", None)
    streams, book = getattr(cfg, "num_codebooks", None), getattr(cfg, "codebook_vocab_size", None)
    if isinstance(streams, int) and isinstance(book, int) and kw.get("input_ids") is not None and kw["input_ids"].dim() == 2:
        # Speech-text streams (Kyutai STT): each step is a text id and one audio code per
        # codebook, (batch, seq, 1 + codebooks); the labels stay the text ids.
        codes = torch.randint(0, book - 1, (*kw["input_ids"].shape, streams), generator=g)
        kw["input_ids"] = torch.cat([kw["input_ids"].unsqueeze(-1), codes], dim=-1)
    both = all(params[k].default is inspect.Parameter.empty for k in ("input_features", "input_values")
               if k in params)
    if "input_features" in kw and "input_values" in kw and not both:
        # A speech encoder-decoder takes whichever its encoder reads (wav2vec2: values).
        try:
            with torch.no_grad():
                model(**{k: v for k, v in kw.items() if k != "input_features"})
            kw.pop("input_features")
        except Exception:  # noqa: BLE001 -- it reads features
            kw.pop("input_values")
    if "input_features" in kw:
        f = kw["input_features"]
        t = f.transpose(1, 2).contiguous()
        kw["input_features"] = _probe(model, kw, "input_features", (f, t, t.unsqueeze(1)))
    if not kw:
        raise ValueError("no input this pipeline knows how to make: "
                         + ", ".join(list(params)[:6]))
    return kw


def _named_inputs(model, cfg, params, kw, batch, seq, g):
    """Inputs a few families name for their modality: layout boxes, reinforcement-learning
    trajectories, robot states, region features, task prompts, prompt images."""
    out = {}
    v = lambda k, d=None: getattr(cfg, k, d)  # noqa: E731
    if "bbox" in params and "input_ids" in kw:
        # (x0, y0, x1, y1) boxes on LayoutLM's 0..1000 grid, each with x0 <= x1, y0 <= y1.
        lo = torch.randint(0, 500, (batch, seq, 2), generator=g)
        hi = lo + torch.randint(0, 500, (batch, seq, 2), generator=g)
        boxes = torch.cat([lo, hi], dim=-1)
        out["bbox"] = _probe(model, {**kw, **out}, "bbox", (boxes, boxes.float() / 1000))
    if "decoder_input_values" in params and "input_ids" in kw:
        # Text-to-speech decoders (SpeechT5) read mel frames (teacher forcing), and a
        # speaker's x-vector when the config sizes one.
        out["decoder_input_values"] = torch.randn(batch, 6, _mel_bins(cfg), generator=g)
        if "speaker_embeddings" in params and isinstance(v("speaker_embedding_dim"), int):
            out["speaker_embeddings"] = torch.randn(batch, cfg.speaker_embedding_dim, generator=g)
    if "lang_ids" in params and "input_ids" in kw:
        out["lang_ids"] = torch.zeros(batch, dtype=torch.long)  # X-MOD's language adapter 0
    if "states" in params and isinstance(v("state_dim"), int):  # Decision Transformer
        out.update(states=torch.randn(batch, seq, cfg.state_dim, generator=g),
                   actions=torch.randn(batch, seq, cfg.act_dim, generator=g),
                   rewards=torch.randn(batch, seq, 1, generator=g),
                   returns_to_go=torch.randn(batch, seq, 1, generator=g),
                   timesteps=torch.arange(seq).repeat(batch, 1),
                   attention_mask=torch.ones(batch, seq, dtype=torch.long))
    if "state" in params and isinstance(v("max_state_dim"), int):  # PI0: noise and time given
        out.update(state=torch.randn(batch, cfg.max_state_dim, generator=g),
                   noise=torch.randn(batch, cfg.chunk_size, cfg.max_action_dim, generator=g),
                   timestep=torch.rand(batch, generator=g),
                   actions=torch.randn(batch, cfg.chunk_size, cfg.max_action_dim, generator=g))
        if "pixel_values" in kw and "pixel_attention_mask" in params:  # one camera
            out.update(pixel_values=kw["pixel_values"].unsqueeze(1),
                       pixel_attention_mask=torch.ones(batch, 1, dtype=torch.bool))
    if "visual_feats" in params and isinstance(v("visual_feat_dim"), int):  # LXMERT regions
        out.update(visual_feats=torch.randn(batch, 4, cfg.visual_feat_dim, generator=g),
                   visual_pos=torch.rand(batch, 4, v("visual_pos_dim", 4), generator=g))
    if "query_embeds" in params and "input_ids" not in kw and hasattr(cfg, "encoder_hidden_size"):
        # A Q-Former alone (BLIP-2's): learned queries attending to image features.
        out["query_embeds"] = torch.randn(batch, 4, cfg.hidden_size, generator=g)
        if "encoder_hidden_states" in params:
            width = getattr(cfg, "encoder_hidden_size", None) or cfg.hidden_size
            out["encoder_hidden_states"] = torch.randn(batch, 6, width, generator=g)
    if "image_encoder_embeddings" in params and "pixel_values" in kw and "input_ids" in kw:
        # IDEFICS: (batch, images, channels, height, width), each token sees the one image.
        pv = kw["pixel_values"]
        out["pixel_values"] = pv.unsqueeze(1) if pv.dim() == 4 else pv
        out["image_attention_mask"] = torch.ones(batch, kw["input_ids"].shape[1], 1, dtype=torch.long)
    if "classes_structure" in params and "pixel_values" in kw:
        # Open-vocabulary detection from prompts (OmDet-Turbo): each image's task prompt, its
        # class names tokenized one per row, all images' rows stacked, and each image's class
        # count (2, then 1, ...: regrouping pads to the largest); one task prompt padded.
        text = _sub(cfg, "text_config")
        top = max(4, min(getattr(text, "vocab_size", 128) or 128, 128) - SPECIAL_IDS)
        counts = [2 - i % 2 for i in range(batch)]
        n = sum(counts)
        task_mask = torch.ones(batch, seq, dtype=torch.long)
        task_mask[-1, -2:] = 0
        out.update(classes_input_ids=torch.randint(3, top, (n, 4), generator=g),
                   classes_attention_mask=torch.ones(n, 4, dtype=torch.long),
                   tasks_input_ids=torch.randint(3, top, (batch, seq), generator=g),
                   tasks_attention_mask=task_mask, classes_structure=torch.tensor(counts))
    if "task_inputs" in params:  # OneFormer's "the task is semantic" prompt, as token ids
        n = v("task_seq_len", seq)
        out["task_inputs"] = torch.randint(3, 100, (batch, n), generator=g)
    if "prompt_pixel_values" in params and "pixel_values" in kw:  # SegGPT: a prompt pair
        b, c, h, w = kw["pixel_values"].shape  # stacked on the input: half the height each
        pv = out["pixel_values"] = torch.randn(b, c, h // 2, w, generator=g)
        out.update(prompt_pixel_values=torch.randn(pv.shape, generator=g),
                   prompt_masks=torch.randn(pv.shape, generator=g))
    if "flattened_patches" in params:  # Pix2Struct: (row, column, patch values) per patch
        vis = _sub(cfg, "vision_config")
        p, n = getattr(vis, "patch_size", 4), 16
        width = getattr(vis, "patch_embed_hidden_size", 3 * p * p)
        rows = torch.arange(n).div(4, rounding_mode="floor") + 1
        cols = torch.arange(n) % 4 + 1
        pos = torch.stack([rows, cols], dim=-1).float().expand(batch, n, 2)
        out["flattened_patches"] = torch.cat(
            [pos, torch.randn(batch, n, width, generator=g)], dim=-1)
        if "input_ids" not in kw:  # (Kosmos-2.5's attention mask is its text's)
            out["attention_mask"] = torch.ones(batch, n)
    if "duration_labels" in params and "input_ids" in kw:
        # FastSpeech 2 trains on aligned targets: 2 frames per token, a pitch and an energy each.
        out.update(spectrogram_labels=torch.randn(batch, 2 * seq, _mel_bins(cfg), generator=g),
                   duration_labels=torch.full((batch, seq), 2, dtype=torch.long),
                   pitch_labels=torch.randn(batch, seq, 1, generator=g),
                   energy_labels=torch.randn(batch, seq, 1, generator=g))
    if "pixel_values_videos" in params and "pixel_values" not in kw:
        # Video towers (V-JEPA 2, VideoPrism): (batch, frames, channels, height, width).
        vis = _sub(cfg, "vision_config")
        size = next((getattr(vis, k) for k in ("crop_size", "image_size") if isinstance(getattr(vis, k, None), int)), 32)
        frames = next((getattr(vis, k) for k in ("frames_per_clip", "num_frames")
                       if isinstance(getattr(vis, k, None), int)), 4)
        chans = next((getattr(vis, k) for k in ("in_chans", "num_channels") if isinstance(getattr(vis, k, None), int)), 3)
        out["pixel_values_videos"] = torch.randn(batch, frames, chans, size, size, generator=g)
    if ("hidden_states" in params and params["hidden_states"].default is inspect.Parameter.empty
            and not kw and type(model).__name__.startswith("VibeVoiceAcousticTokenizer")):
        # VibeVoice's tokenizer halves alone: the encoder takes a waveform (batch, channels,
        # samples, one hop of 3200 here), the decoder latents (batch, width, frames).
        conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv1d))
        n = 4 if "Decoder" in type(model).__name__ else 3200
        out["hidden_states"] = torch.randn(batch, conv.in_channels, n, generator=g)
    if "noise_embeds" in params and "context_hidden_states" in params and isinstance(v("hidden_size"), int):
        # A block-diffusion drafter (Muse Glimmer's assistant): a block of noised token
        # embeddings, and the target model's hidden states at its chosen layers, side by side.
        layers = len(v("target_layer_ids", None) or [0])
        out.update(noise_embeds=torch.randn(batch, v("block_size", 4) or 4, cfg.hidden_size, generator=g),
                   context_hidden_states=torch.randn(batch, seq, layers * cfg.hidden_size, generator=g))
    if "audio_mel" in params:  # Gemma 3n's audio encoder: (batch, frames, mel bins)
        mels = v("input_feat_size", 128)
        out.update(audio_mel=torch.randn(batch, 32, mels, generator=g),
                   audio_mel_mask=torch.zeros(batch, 32, dtype=torch.bool))
    if getattr(cfg, "model_type", None) == "voxtral_realtime_text":
        # Its layers scale by a time conditioning that the speech model computes and passes
        # through **kwargs (absent from the signature): one vector, broadcast over the batch.
        out["t_cond"] = torch.randn(1, cfg.hidden_size, generator=g)
    return out


def _patched_series(model, cfg, params, batch, g):
    """TimesFM-style forecasters: a history of whole patches, its padding and frequency."""
    p = getattr(cfg, "patch_length", 8) or 8
    kw = {"past_values": torch.randn(batch, 4 * p, generator=g)}
    if "past_values_padding" in params:
        kw["past_values_padding"] = torch.zeros(batch, 4 * p, dtype=torch.long)
    if "freq" in params:
        kw["freq"] = torch.zeros(batch, 1, dtype=torch.long)
    return kw


def _series(cfg, params, batch, g):
    """Time-series inputs: a forecaster's history (with lags and time features) and its
    horizon, or a multichannel window (PatchTST, PatchTSMixer)."""
    kw = {}
    lags = getattr(cfg, "lags_sequence", None)
    if isinstance(getattr(cfg, "prediction_length", None), int) and lags:
        past, horizon = cfg.context_length + max(lags), cfg.prediction_length
        nf = getattr(cfg, "num_time_features", 0) or 0
        kw["past_values"] = torch.randn(batch, past, generator=g)
        kw["past_time_features"] = torch.randn(batch, past, nf, generator=g)
        kw["past_observed_mask"] = torch.ones(batch, past)
        kw["future_values"] = torch.randn(batch, horizon, generator=g)
        kw["future_time_features"] = torch.randn(batch, horizon, nf, generator=g)
    elif isinstance(getattr(cfg, "num_input_channels", None), int):
        kw["past_values"] = torch.randn(batch, cfg.context_length, cfg.num_input_channels, generator=g)
    return {k: v for k, v in kw.items() if k in params}


def _mel_bins(cfg):
    """Width of one audio feature frame: the first mel-bin count of the config tree (the
    audio tower's before the top's), else a feature size (CLVP's conditioning encoder)."""
    nodes = list(_configs(cfg))
    nodes = nodes[1:] + nodes[:1]
    for key in ("feature_projection_input_dim", "num_mel_bins", "feature_size", "n_mels", "input_dim"):
        for node in nodes:
            if isinstance(vars(node).get(key), int):
                # Low-frame-rate encoders (Fun-ASR-Nano) stack num_stacked_frames frames into one.
                stacked = vars(node).get("num_stacked_frames")
                return MEL_STACK.get(cfg.model_type, 1) * (stacked if isinstance(stacked, int) else 1) * vars(node)[key]
    return 16


def _flat_patches(cfg, batch, g, grid=4):
    """Vision towers that take pre-cut patches (the Qwen2-VL convention): one row per
    patch of channels x frames x patch x patch values, and each image's (t, h, w) grid."""
    p = getattr(cfg, "patch_size", 4) or 4
    t = getattr(cfg, "temporal_patch_size", None) or getattr(cfg, "patch_temporal", 1) or 1  # (Muse Glimmer's name)
    c = getattr(cfg, "in_channels", None) or getattr(cfg, "num_channels", 3) or 3
    rows = batch * grid * grid
    return torch.randn(rows, c * t * p * p, generator=g), torch.tensor([[1, grid, grid]] * batch)


def _probe(model, kw, key, candidates, extra=None):
    """The first layout of input `key` the model takes on the CPU: audio features as
    (batch, mel bins, frames) (Whisper), (batch, frames, mel bins) (Conformer encoders) or
    (batch, 1, frames, mel bins); audio values as a waveform or a spectrogram. When none
    works, the first, and the real run says why. `extra(candidate)`: inputs sized by it."""
    got = _first_working(model, kw, key, candidates, extra)
    return candidates[0] if got is None else got


def _first_working(model, kw, key, candidates, extra=None):
    for cand in candidates:
        try:
            with torch.no_grad():
                model(**{**kw, key: cand, **(extra(cand) if extra else {})})
            return cand
        except Exception:  # noqa: BLE001 -- try the next layout
            continue
    return None


def _image_token(cfg, kind="image"):
    return next((getattr(cfg, k) for k in (f"{kind}_token_id", f"{kind}_token_index")
                 if isinstance(getattr(cfg, k, None), int)), None)


def _features_getter(model, kind, named=False):
    """The model's get_<kind>_features, else its base model's, else its encoder's (an
    encoder-decoder's base model, T5Gemma 2's, keeps the image tower in its encoder);
    `named`: the first whose signature names its inputs (VibeVoice ASR's head passes
    *args, **kwargs through)."""
    gets = [getattr(m, f"get_{kind}_features", None)
            for m in (model, getattr(model, "model", None), getattr(model, "encoder", None))]
    gets = [g for g in gets if g is not None]
    if named:
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        gets = [g for g in gets if any(p.kind in kinds for p in inspect.signature(g).parameters.values())] or gets
    return gets[0] if gets else None


def _with_image_tokens(model, cfg, kw, ids, kind="image", key="pixel_values"):
    """Prepends one placeholder token per image (or audio) feature the model makes (a
    vision- or audio-language model checks that the counts agree)."""
    tok = _image_token(cfg, kind)
    get = _features_getter(model, kind)
    if tok is not None and get is None and kind == "audio":
        return _with_audio_tokens_by_length(model, kw[key], ids, tok)
    if tok is None or get is None:
        return ids
    takes = inspect.signature(get).parameters
    rest = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in takes.values())
    # (Through **kwargs too, the inputs named for this kind, VideoLLaMA 3's image_merge_sizes,
    # and MiniCPM-V's patch grids.)
    extra = {k: v for k, v in kw.items()
             if (k in takes or rest and (k.startswith(kind + "_") or k == "target_sizes")) and k != key}
    pv = kw[key]
    # Images per sample: some models take (batch, images, channels, height, width); audio
    # features come as (batch, mel bins, frames) or (batch, frames, mel bins) (Granite Speech).
    cands = ((pv, pv.unsqueeze(1)) if pv.dim() == 4 else
             (pv, pv.transpose(1, 2).contiguous()) if kind == "audio" and pv.dim() == 3 else (pv,))
    patch = getattr(_sub(cfg, "vision_config"), "patch_size", None)
    if kind == "image" and pv.dim() == 4 and type(patch) is int and pv.shape[-1] % patch == pv.shape[-2] % patch == 0:
        # Or the images' patches flattened into rows, (patches, channels x p x p), one
        # placeholder each (NeoMME).
        b, c, h, w = pv.shape
        rows = pv.reshape(b, c, h // patch, patch, w // patch, patch).permute(0, 2, 4, 1, 3, 5)
        cands += (rows.reshape(-1, c * patch * patch).contiguous(),)
        t = getattr(_sub(cfg, "vision_config"), "temporal_patch_size", None)
        if type(t) is int:
            # Or channel-last (patches, frames, p, p, channels) blocks, the image repeated
            # over the frames (Inkling's hierarchical patch encoder).
            blocks = rows.permute(0, 1, 2, 4, 5, 3).reshape(-1, patch, patch, c).unsqueeze(1).expand(-1, t, -1, -1, -1)
            cands += (blocks.contiguous(),)
    p = int((pv.shape[-1] // 3) ** 0.5) if pv.dim() == 2 else 0
    if p and 3 * p * p == pv.shape[-1]:
        # Pre-cut patches as (patches, channels, p, p) (Kimi K2.5), or all in one sequence,
        # (1, patches, channels, p, p) (PaddleOCR-VL).
        cands = (pv, pv.view(-1, 3, p, p), pv.view(1, -1, 3, p, p))
    for cand in cands:
        try:
            with torch.no_grad():
                feats = get(**{key: cand}, **extra)
            kw[key] = cand
            break
        except Exception:  # noqa: BLE001 -- the forward itself then reports why
            continue
    else:
        # Music Flamingo's get_audio_features checks the placeholders it is to count.
        return _with_audio_tokens_by_length(model, pv, ids, tok) if kind == "audio" else ids
    feats = getattr(feats, "pooler_output", None) if hasattr(feats, "to_tuple") else feats
    width = getattr(_sub(cfg, "text_config"), "hidden_size", None)
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    lasts = {t.shape[-1] for t in flat_tensors(feats) if t.dim()}
    if isinstance(getattr(emb, "embedding_dim", None), int) and lasts != {width}:
        width = emb.embedding_dim  # the width features are scattered into (T5Gemma 2 has no text_config)
        # (unless the features have the text width: NeoMME's input embedding is wider.)
    n = sum(t.numel() for t in flat_tensors(feats))
    if not width or n % (width * ids.shape[0]):
        return ids
    per = n // (width * ids.shape[0])
    return torch.cat([torch.full((ids.shape[0], per), tok, dtype=ids.dtype), ids], dim=1)


def _with_audio_tokens_by_length(model, feats, ids, tok):
    """Audio-language models without get_audio_features (Qwen2-Audio) count their audio
    tokens with the tower's own output-length formula: that many placeholders per sample."""
    tower = getattr(model, "audio_tower", None) or getattr(getattr(model, "model", None), "audio_tower", None)
    lengths = getattr(tower, "_get_feat_extract_output_lengths", None)
    if lengths is None:
        return ids
    out = lengths(torch.tensor([feats.shape[-1]]))
    per = int((out[-1] if isinstance(out, tuple) else out)[0])
    return torch.cat([torch.full((ids.shape[0], per), tok, dtype=ids.dtype), ids], dim=1)


def loss_of(out):
    """The model's own loss, else a fixed weighted mean of every floating output (a scalar
    to train on). Not the plain mean: the mean of a LayerNorm's output over its normalized
    dim is its bias, so every gradient above it is zero in exact arithmetic and the step
    would compare two roundings of zero (Parakeet's encoder)."""
    loss = getattr(out, "loss", None) if not isinstance(out, (tuple, list)) else None
    if loss is not None:
        return loss if loss.dim() == 0 else loss.mean()  # per-sample losses (DAC's codebook loss)
    leaves = [t for t in flat_tensors(out) if t.is_floating_point() and t.numel()]
    if not leaves:
        raise ValueError("the model returned no floating tensor")
    return sum((t.float() * loss_weights(t)).mean() for t in leaves)


def loss_weights(t):
    """Weights in [0.5, 1.5), drawn on the CPU from a fixed seed (the same on every
    device and dtype), shaped like `t`."""
    g = torch.Generator().manual_seed(t.numel())
    return (0.5 + torch.rand(t.shape, generator=g)).to(t.device)


def flat_tensors(out) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flat_tensors(o)]
    return []


def finite_scale(t: torch.Tensor) -> float:
    v = t.detach().float().abs()
    v = v[torch.isfinite(v)]
    return float(v.max()) if v.numel() else 0.0
