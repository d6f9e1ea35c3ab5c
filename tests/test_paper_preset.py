"""The `paper-recon` preset reproduces the ReconScore paper's settings and adds none of its own."""

from caprecon.run.config import RunConfig
from caprecon.run.roles import Roles


def test_paper_recon_leaves_guidance_to_the_pipeline(tiny_sd):
    # The base Z-Image is guided; the paper names no scale, so the pipeline's default must apply.
    # Only the model is swapped for a tiny local pipeline: steps, text length and guidance come
    # from the preset and the registry entry, as in a real run.
    config = RunConfig.build(preset="paper-recon", generator_options={"model": str(tiny_sd)})
    generator = Roles(config).generator
    generator.pipeline  # loaded, so the call options are filtered by what it accepts
    assert generator.guidance is None and generator.describe()["guidance"] is None
    call = generator._call_options()
    assert "guidance_scale" not in call
    assert call["num_inference_steps"] == 28

    chosen = RunConfig.build(preset="paper-recon", generator_options={"model": str(tiny_sd), "guidance": 4.0})
    chosen_generator = Roles(chosen).generator
    chosen_generator.pipeline
    assert chosen_generator._call_options()["guidance_scale"] == 4.0


def test_paper_recon_caps_the_long_side_at_1024_and_never_scales_up():
    # "All synthetic images strictly preserved the aspect ratio of the original images, with the maximum
    # spatial dimension capped at 1024 pixels" (ReconScore paper, implementation details)
    paper = RunConfig.build(preset="paper-recon")
    assert (paper.max_side, paper.upscale) == (1024, False)
    assert paper.spec.size_for(2048, 1536) == (1024, 768)  # capped
    assert paper.spec.size_for(256, 256) == (256, 256)  # a UCM tile keeps its size
    assert paper.spec.size_for(600, 400) == (608, 400)  # sides to multiples of 16 only
    # caprecon's own default scales small sources up to the long side; a user may ask for it under the preset
    assert RunConfig.build().spec.size_for(256, 256) == (1024, 1024)
    assert RunConfig.build(preset="paper-recon", upscale=True).spec.size_for(256, 256) == (1024, 1024)


def test_upscale_flags_override_the_preset():
    import argparse

    from caprecon.cli.common import add_run_options, run_settings

    parser = argparse.ArgumentParser()
    add_run_options(parser)
    for flags, upscale in (([], False), (["--upscale"], True), (["--no-upscale"], False)):
        settings = run_settings(parser.parse_args(["--preset", "paper-recon", *flags]))
        assert RunConfig.build(**settings).upscale is upscale
