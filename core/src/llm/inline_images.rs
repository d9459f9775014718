//! Images a request shows the model: tool results that refer to image blobs
//! ([`crate::images`]) become the dialect's image content. The host loads the bytes of the images
//! [`to_load`] picks (newest first, within [`MAX_REQUEST_IMAGES`] and
//! [`MAX_REQUEST_IMAGE_BYTES`]) into [`LlmRequest::images`](super::LlmRequest); the codecs then
//! inline those ([`for_result`]) and put a text note in place of every other image.

use crate::wire::{BlobRef, Message, ToolResult};

/// Most images one request carries (the newest).
pub const MAX_REQUEST_IMAGES: usize = 8;

/// Most image bytes one request carries, before base64 (which adds a third): well within
/// Anthropic's 32 MB request limit and OpenAI's.
pub const MAX_REQUEST_IMAGE_BYTES: u64 = 10 * 1024 * 1024;

/// The images of a request by blob URI (`wuhu://blob/<id>`): at most [`MAX_REQUEST_IMAGES`],
/// so a list (a map's code costs the Worker's wasm more than its lookups save).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InlineImages(Vec<(String, InlineImage)>, bool);

impl InlineImages {
    /// No images.
    pub fn new() -> InlineImages {
        InlineImages::default()
    }

    /// No images, because the model accepts none (its model table row says `"images": false`):
    /// the notes say so.
    pub fn text_only() -> InlineImages {
        InlineImages(Vec::new(), true)
    }

    /// Adds (or replaces) the image of `uri`.
    pub fn insert(&mut self, uri: String, image: InlineImage) {
        self.0.retain(|(u, _)| *u != uri);
        self.0.push((uri, image));
    }

    /// The image of `uri`, if loaded.
    pub fn get(&self, uri: &str) -> Option<&InlineImage> {
        self.0.iter().find(|(u, _)| u == uri).map(|(_, i)| i)
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One image's bytes, base64-encoded, and its media type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InlineImage {
    /// `image/png`, `image/jpeg`, `image/gif` or `image/webp`.
    pub media_type: String,
    /// The bytes, standard base64 with padding.
    pub base64: String,
}

impl InlineImage {
    /// An image of `media_type` from its bytes.
    pub fn new(media_type: &str, bytes: &[u8]) -> InlineImage {
        InlineImage {
            media_type: media_type.to_string(),
            base64: base64(bytes),
        }
    }

    /// `data:<media type>;base64,<data>` (OpenAI's image URLs).
    pub fn data_url(&self) -> String {
        format!("data:{};base64,{}", self.media_type, self.base64)
    }
}

/// Standard base64 with padding (RFC 4648), by hand: a few instructions in the Worker's wasm.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The image blobs of `result` a model may be shown (image media type, within the per-image
/// limit).
pub fn image_blobs(result: &ToolResult) -> impl Iterator<Item = &BlobRef> {
    result.blobs.iter().filter(|b| {
        crate::images::IMAGE_MEDIA_TYPES.contains(&b.media_type.as_str())
            && b.size <= crate::images::MAX_IMAGE_BYTES
    })
}

/// The images of `messages` a request should carry: the newest first, until one would pass
/// [`MAX_REQUEST_IMAGES`] or [`MAX_REQUEST_IMAGE_BYTES`] (it and every older image are left
/// out).
pub fn to_load(messages: &[Message]) -> Vec<BlobRef> {
    let mut chosen: Vec<BlobRef> = Vec::new();
    let mut bytes = 0u64;
    for message in messages.iter().rev() {
        let Message::ToolResult(result) = message else {
            continue;
        };
        let blobs: Vec<&BlobRef> = image_blobs(result).collect();
        for blob in blobs.into_iter().rev() {
            if chosen.iter().any(|c| c.uri == blob.uri) {
                continue;
            }
            if chosen.len() >= MAX_REQUEST_IMAGES || bytes + blob.size > MAX_REQUEST_IMAGE_BYTES {
                return chosen;
            }
            bytes += blob.size;
            chosen.push(blob.clone());
        }
    }
    chosen
}

/// What a codec sends for `result`: its text (with a note for each image it cannot show) and the
/// images it inlines, in the result's order.
pub fn for_result<'a>(
    result: &'a ToolResult,
    images: &'a InlineImages,
) -> (String, Vec<(&'a str, &'a InlineImage)>) {
    let mut text = result.content.clone();
    let mut shown = Vec::new();
    for blob in result.blobs.iter() {
        if !crate::images::IMAGE_MEDIA_TYPES.contains(&blob.media_type.as_str()) {
            continue;
        }
        match images.get(&blob.uri) {
            Some(image) => shown.push((blob.uri.as_str(), image)),
            None => {
                if !text.is_empty() {
                    text.push_str("\n\n");
                }
                if images.1 {
                    text.push_str(&format!(
                        "[The image {} is not shown: the model table marks this model as not accepting images.]",
                        blob.uri
                    ));
                } else {
                    text.push_str(&format!(
                        "[The image {} is not shown in this request: a request carries only the newest {MAX_REQUEST_IMAGES} images, at most {} MiB in all. Read the file again to see it.]",
                        blob.uri,
                        MAX_REQUEST_IMAGE_BYTES / (1024 * 1024)
                    ));
                }
            }
        }
    }
    (text, shown)
}

/// The text that introduces a tool result's images where a dialect sends them as a user
/// message after the tool output (OpenAI Responses and Chat Completions).
pub fn caption(result: &ToolResult, uri: &str) -> String {
    format!(
        "The image {uri} returned by the {} call {}:",
        result.tool_name, result.tool_call_id
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(n: u8, size: u64) -> BlobRef {
        BlobRef {
            uri: format!("wuhu://blob/{n}"),
            size,
            media_type: "image/png".into(),
            preview: None,
            width: Some(1),
            height: Some(1),
        }
    }

    fn result(blobs: Vec<BlobRef>) -> Message {
        Message::ToolResult(ToolResult {
            tool_call_id: "c".into(),
            tool_name: "read".into(),
            content: "an image".into(),
            is_error: false,
            blobs,
        })
    }

    fn uris(blobs: &[BlobRef]) -> Vec<String> {
        blobs.iter().map(|b| b.uri.clone()).collect()
    }

    #[test]
    fn the_newest_images_within_the_bounds_are_loaded() {
        let mib = 1024 * 1024;
        let text = BlobRef {
            media_type: "text/plain".into(),
            ..image(99, 10)
        };
        let cases: Vec<(&str, Vec<Message>, Vec<u8>)> = vec![
            ("none", vec![], vec![]),
            (
                "text blobs are not images",
                vec![result(vec![text])],
                vec![],
            ),
            ("one", vec![result(vec![image(1, 70)])], vec![1]),
            (
                "newest first",
                (1..=3).map(|n| result(vec![image(n, 70)])).collect(),
                vec![3, 2, 1],
            ),
            (
                "at most the count",
                (1..=12).map(|n| result(vec![image(n, 70)])).collect(),
                (5..=12).rev().collect(),
            ),
            (
                "at most the bytes: the older ones stop at the first that does not fit",
                vec![
                    result(vec![image(1, 10)]),
                    result(vec![image(2, 4 * mib)]),
                    result(vec![image(3, 4 * mib)]),
                    result(vec![image(4, 4 * mib)]),
                ],
                vec![4, 3],
            ),
            (
                "exactly the bytes",
                vec![
                    result(vec![image(1, 5 * mib)]),
                    result(vec![image(2, 5 * mib)]),
                ],
                vec![2, 1],
            ),
            (
                "an image over the per-image limit is never loaded",
                vec![result(vec![image(1, 70)]), result(vec![image(2, 6 * mib)])],
                vec![1],
            ),
            (
                "the same image twice is loaded once",
                vec![result(vec![image(1, 70)]), result(vec![image(1, 70)])],
                vec![1],
            ),
        ];
        for (name, messages, expected) in cases {
            let loaded = to_load(&messages);
            let expected: Vec<String> = expected
                .iter()
                .map(|n| format!("wuhu://blob/{n}"))
                .collect();
            assert_eq!(uris(&loaded), expected, "{name}");
            assert!(loaded.len() <= MAX_REQUEST_IMAGES, "{name}");
            assert!(
                loaded.iter().map(|b| b.size).sum::<u64>() <= MAX_REQUEST_IMAGE_BYTES,
                "{name}"
            );
        }
    }

    /// A step with two tool calls (an image loaded, an image not loaded), then a user message.
    fn request() -> crate::llm::LlmRequest {
        use crate::wire::{AssistantMessage, ContentBlock, ToolCall};
        let call = |id: &str| {
            ContentBlock::ToolCall(ToolCall {
                id: id.into(),
                name: "read".into(),
                arguments: serde_json::json!({"path": "shot.png"}),
            })
        };
        let tool_result = |id: &str, n: u8| {
            Message::ToolResult(ToolResult {
                tool_call_id: id.into(),
                tool_name: "read".into(),
                content: format!("shot {n}"),
                is_error: false,
                blobs: vec![image(n, 70)],
            })
        };
        let mut images = InlineImages::new();
        images.insert(
            "wuhu://blob/1".into(),
            InlineImage::new("image/png", b"\x89PNG"),
        );
        crate::llm::LlmRequest {
            model: "m".into(),
            system_prompt: String::new(),
            messages: vec![
                Message::Assistant(AssistantMessage {
                    content: vec![call("c1"), call("c2")],
                    ..AssistantMessage::default()
                }),
                tool_result("c1", 1),
                tool_result("c2", 2),
                Message::User {
                    author: "ana".into(),
                    content: "what is it?".into(),
                    queue_item_id: None,
                    lane: Default::default(),
                    acting_for: None,
                },
            ],
            tools: Vec::new(),
            max_output_tokens: None,
            reasoning: None,
            images,
        }
    }

    fn body(http: crate::llm::HttpRequest) -> serde_json::Value {
        serde_json::from_str(&http.body).unwrap()
    }

    const NOTE: &str = "shot 2\n\n[The image wuhu://blob/2 is not shown in this request: a request carries only the newest 8 images, at most 10 MiB in all. Read the file again to see it.]";

    #[test]
    fn each_dialect_shows_the_loaded_image_and_notes_the_other() {
        use serde_json::json;
        let request = request();
        let anthropic = body(crate::llm::anthropic::build_http_request(
            "http://a", None, &request,
        ));
        let user = &anthropic["messages"][1];
        assert_eq!(user["role"], "user");
        assert_eq!(
            user["content"][0]["content"],
            json!([
                {"type": "text", "text": "shot 1"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw=="}},
            ])
        );
        assert_eq!(user["content"][1]["content"], NOTE);
        assert_eq!(user["content"][2]["text"], "what is it?");

        let chat = body(crate::llm::openai::build_http_request(
            "http://a", None, &request,
        ));
        let messages = chat["messages"].as_array().unwrap();
        let roles: Vec<&str> = messages
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        // The tool messages stay together after the assistant; the image follows them.
        assert_eq!(roles, ["assistant", "tool", "tool", "user", "user"]);
        assert_eq!(messages[1]["content"], "shot 1");
        assert_eq!(messages[2]["content"], NOTE);
        assert_eq!(
            messages[3]["content"],
            json!([
                {"type": "text", "text": "The image wuhu://blob/1 returned by the read call c1:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}},
            ])
        );

        let responses = body(crate::llm::responses::build_http_request(
            "http://a", None, &request,
        ));
        let items = responses["input"].as_array().unwrap();
        let kinds: Vec<String> = items
            .iter()
            .map(|i| {
                i["type"]
                    .as_str()
                    .or(i["role"].as_str())
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "function_call",
                "function_call",
                "function_call_output",
                "function_call_output",
                "user",
                "user"
            ]
        );
        assert_eq!(items[2]["output"], "shot 1");
        assert_eq!(items[3]["output"], NOTE);
        assert_eq!(
            items[4]["content"],
            json!([
                {"type": "input_text", "text": "The image wuhu://blob/1 returned by the read call c1:"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw=="},
            ])
        );
        // A text-only model: no image, a note that says why.
        let text_only = crate::llm::LlmRequest {
            images: InlineImages::text_only(),
            ..request.clone()
        };
        let chat = body(crate::llm::openai::build_http_request(
            "http://a", None, &text_only,
        ));
        assert!(!chat.to_string().contains("image_url"), "{chat}");
        assert_eq!(
            chat["messages"][1]["content"],
            "shot 1\n\n[The image wuhu://blob/1 is not shown: the model table marks this model as not accepting images.]"
        );
        // A request without images is what it was.
        let plain = crate::llm::LlmRequest {
            images: InlineImages::new(),
            ..request
        };
        let chat = body(crate::llm::openai::build_http_request(
            "http://a", None, &plain,
        ));
        assert_eq!(chat["messages"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn base64_is_the_standard_one() {
        // RFC 4648's test vectors.
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain}");
        }
        assert_eq!(base64(&[0xfb, 0xff, 0xbf]), "+/+/");
    }

    #[test]
    fn an_image_not_loaded_is_a_note() {
        let Message::ToolResult(r) = result(vec![image(1, 70), image(2, 70)]) else {
            unreachable!()
        };
        let mut images = InlineImages::new();
        images.insert(
            "wuhu://blob/2".into(),
            InlineImage::new("image/png", b"\x89PNG"),
        );
        let (text, shown) = for_result(&r, &images);
        assert_eq!(shown.len(), 1);
        assert_eq!(shown[0].0, "wuhu://blob/2");
        assert_eq!(shown[0].1.base64, "iVBORw==");
        assert_eq!(shown[0].1.data_url(), "data:image/png;base64,iVBORw==");
        assert!(
            text.starts_with("an image\n\n[The image wuhu://blob/1 is not shown"),
            "{text}"
        );
        assert!(!text.contains("wuhu://blob/2 is not shown"), "{text}");
    }
}
