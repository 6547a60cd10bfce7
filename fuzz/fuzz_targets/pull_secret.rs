//! Pull secrets (`.dockerconfigjson`, `.dockercfg`, username/password) and image references: any data gives
//! credentials or an error, and matching them to any reference never panics.
#![no_main]

use std::collections::BTreeMap;

use inlet_image::auth;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (&str, &[u8], u8)| {
    let (reference, raw, which) = input;
    let key = [".dockerconfigjson", ".dockercfg", "password"][usize::from(which % 3)];
    let mut data = BTreeMap::from([(key.to_string(), raw.to_vec())]);
    if key == "password" {
        data.insert("username".into(), b"user".to_vec());
    }
    if let Ok(credentials) = auth::from_secret_data(&data) {
        let _ = auth::for_reference(&credentials, reference);
    }
});
