"""V4.1 image handling: placeholders in prompts, token counts, OpenCV preprocessing."""
import base64

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernforge.recipe as K
from kernforge.recipe import images as I

cv2 = pytest.importorskip("cv2")
P = pytest.importorskip("deepseek_recipe")


@settings(max_examples=200, deadline=None)
@given(st.integers(20, 120), st.integers(20, 120))
def test_token_count_matches_peer(pw, ph):
    """On grids the peer keeps as they are (within its patch budget), token counts agree."""
    from hypothesis import assume
    w, h = pw * I.PATCH, ph * I.PATCH
    assume(pw * ph >= I.MIN_PATCHES and I.image_token_count(w, h) <= I.MAX_TOKENS)
    peer = P.MultiModalData([P.ImageInfo(b"x", w, h)]).image_token_adjustment() + 1
    assert I.image_token_count(w, h) == peer


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2048), st.integers(1, 2048), st.sampled_from(["high", "low"]))
def test_target_size_is_patch_aligned_bounded_and_keeps_aspect(w, h, detail):
    tw, th = I.target_size(w, h, detail)
    assert tw % I.PATCH == 0 and th % I.PATCH == 0 and tw > 0 and th > 0
    patches = (tw // I.PATCH) * (th // I.PATCH)
    assert patches <= max(I.MAX_PATCHES[detail], I.MIN_PATCHES) * 1.05
    if min(w, h) * 40 >= max(w, h):  # not a sliver: aspect kept up to patch rounding
        assert abs((th / tw) / (h / w) - 1) <= I.PATCH / min(tw, th) + 0.02
        assert patches >= I.MIN_PATCHES * 0.85  # rounding to whole patches may undershoot a little
    assert I.image_token_count(tw, th) <= I.MAX_TOKENS


def _png(h, w, seed=0):
    rng = np.random.default_rng(seed)
    img = rng.integers(1, 255, (h, w, 3), dtype=np.uint8)  # never all zeros
    return img, cv2.imencode(".png", img)[1].tobytes()


@pytest.mark.parametrize("h,w,detail", [(30, 50, "high"), (600, 800, "high"), (600, 800, "low"),
                                        (1080, 1920, "high"), (7, 900, "high")])
def test_preprocess_resizes_like_opencv_reference(h, w, detail):
    img, data = _png(h, w)
    info = I.preprocess(data, I.PreprocessOptions(detail))
    assert (info.width, info.height) == I.target_size(w, h, detail)
    out = cv2.imdecode(np.frombuffer(info.data, np.uint8), cv2.IMREAD_COLOR)
    assert out.shape == (info.height, info.width, 3)
    interp = cv2.INTER_AREA if info.width * info.height < w * h else cv2.INTER_CUBIC
    ref = cv2.resize(img, (info.width, info.height), interpolation=interp)
    assert np.array_equal(out, ref)  # PNG is lossless
    assert info.token_count() == I.image_token_count(info.width, info.height)


def test_bad_images_raise_typed_errors():
    with pytest.raises(K.ImageError) as e:
        I.preprocess(b"definitely not an image")
    assert e.value.kind == "UnsupportedImage"
    with pytest.raises(K.ImageError):
        I.preprocess(b"")
    with pytest.raises(K.ImageError):
        I.decode_data_url("data:image/png;base64,@@@")
    _, big = _png(10, 3000)
    with pytest.raises(K.ImageError) as e:
        I.preprocess(big)
    assert e.value.kind == "ImageTooLarge"
    with pytest.raises(K.ImageError):
        I.preprocess_source(K.UrlImageSource("https://example.com/a.png"))


def test_data_url_source_round_trip():
    img, data = _png(40, 60, seed=3)
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    assert I.decode_data_url(url) == data
    info = I.preprocess_source(K.DataUrlImageSource(url, "low"))
    assert (info.width, info.height) == I.target_size(60, 40, "low")


def test_chat_image_prompt_matches_peer_and_marks_placeholders():
    _, data = _png(20, 20)
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    body = {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "first"}, {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "second"}, {"type": "image_url", "image_url": {"url": "https://x/y.png",
                                                                              "detail": "low"}}]}]}
    ours = K.ChatCompletionRequest(body).convert(K.ConversionOptions())
    r = K.DeepseekV41Encoding().render_conversation(ours.conversation)
    peer = P.ChatCompletionRequest(body).convert(P.ConversionOptions())
    pr = P.DeepseekV41Encoding().render_conversation(peer.conversation)
    assert r.prompt == pr.prompt
    assert [tuple(x) for x in r.special_ranges] == [tuple(x) for x in pr.special_ranges]
    assert [s.kind for s in r.image_sources] == ["data_url", "url"]
    assert [s.detail for s in r.image_sources] == ["high", "low"]
    placeholders = [a for a, b in r.special_ranges if r.prompt[a:b] == "<｜image｜>"]
    assert len(placeholders) == 2
    # user text that spells the image token is plain text, not a placeholder
    conv = K.Conversation([K.UserMessage("see <｜image｜> here <｜image｜>", [K.UrlImageSource("https://a")])],
                          thinking_mode=False)
    r2 = K.DeepseekV41Encoding().render_conversation(conv)
    assert len([1 for a, b in r2.special_ranges if r2.prompt[a:b] == "<｜image｜>"]) == 1
