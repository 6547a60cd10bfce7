//! The protobuf codec every generated client and server uses (`build.rs` names it as `codec_path`):
//! prost's, with 1 KiB buffers instead of tonic's default 8 KiB.
//!
//! Each call holds its encode and decode buffers until its stream ends, on the client and on the server, and
//! the messages of these APIs are small (a NodePublishVolume with its volume context is a few hundred
//! bytes). A simulated cluster keeps tens of thousands of calls in flight (bench/RESULTS.md, issue #28). A
//! larger message costs no more copies: prost reserves its encoded length before writing, and the decoder
//! reserves a message's length from its header.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::ProstCodec;

/// The buffer each encoder and decoder starts with.
const BUFFER_SIZE: usize = 1024;
/// tonic's default: how much a streaming response gathers before it is sent.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`ProstCodec`] with small starting buffers.
#[derive(Debug, Clone, Copy)]
pub struct SmallBufferCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SmallBufferCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for SmallBufferCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = <ProstCodec<T, U> as Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD))
    }
}
