//! Any bytes as a request body of `/v1/chat/completions` and `/v1/completions`: parsing
//! and validation must give the request or a 4xx error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_server::api;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = api::object(data) else {
        return;
    };
    let _ = api::check_model(&m, "smollm2-135m-instruct-q4_1");
    for chat in [true, false] {
        let _ = api::unsupported(&m, chat);
        let _ = api::common(&m, chat);
    }
    let _ = api::messages(&m);
    let _ = api::prompts(&m);
});
