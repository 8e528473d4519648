//! G.711 µ-law and A-law, sample by sample (the ITU tables' arithmetic), so the simulated
//! server hears and speaks telephony audio as the service does, and a test can play a
//! caller in those formats ([`tone_in`](super::tone_in)).

use crate::realtime::AudioFormat;

/// One sample of `format` from a linear 16-bit sample; PCM16 formats are not companded.
pub(crate) fn encode(format: AudioFormat, sample: i16) -> u8 {
    match format {
        AudioFormat::G711Alaw => alaw_from_linear(sample),
        _ => ulaw_from_linear(sample),
    }
}

/// The loudest sample (as a magnitude) of `audio` in `format`.
pub(crate) fn peak(format: AudioFormat, audio: &[u8]) -> u16 {
    match format {
        AudioFormat::G711Ulaw => audio
            .iter()
            .map(|&b| linear_from_ulaw(b).unsigned_abs())
            .max(),
        AudioFormat::G711Alaw => audio
            .iter()
            .map(|&b| linear_from_alaw(b).unsigned_abs())
            .max(),
        _ => audio
            .chunks_exact(2)
            .map(|b| i16::from_le_bytes([b[0], b[1]]).unsigned_abs())
            .max(),
    }
    .unwrap_or(0)
}

fn ulaw_from_linear(sample: i16) -> u8 {
    const BIAS: i32 = 0x84;
    const CLIP: i32 = 32_635;
    let value = i32::from(sample);
    let sign = if value < 0 { 0x80 } else { 0 };
    let magnitude = value.abs().min(CLIP) + BIAS;
    // The biased magnitude is at least 0x84, so its top bit is bit 7 or above.
    let exponent = (31 - magnitude.leading_zeros() as i32 - 7).clamp(0, 7);
    let mantissa = (magnitude >> (exponent + 3)) & 0x0F;
    !((sign | (exponent << 4) | mantissa) as u8)
}

fn linear_from_ulaw(code: u8) -> i16 {
    let code = i32::from(!code);
    let exponent = (code >> 4) & 0x07;
    let magnitude = ((((code & 0x0F) << 3) + 0x84) << exponent) - 0x84;
    (if code & 0x80 != 0 {
        -magnitude
    } else {
        magnitude
    }) as i16
}

fn alaw_from_linear(sample: i16) -> u8 {
    const SEGMENT_ENDS: [i32; 8] = [0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF];
    let value = i32::from(sample) >> 3;
    let (mask, magnitude) = if value >= 0 {
        (0xD5, value)
    } else {
        (0x55, -value - 1)
    };
    let Some(segment) = SEGMENT_ENDS.iter().position(|&end| magnitude <= end) else {
        return (0x7F ^ mask) as u8;
    };
    let segment = segment as i32;
    let step = if segment < 2 { 1 } else { segment };
    (((segment << 4) | ((magnitude >> step) & 0x0F)) ^ mask) as u8
}

fn linear_from_alaw(code: u8) -> i16 {
    let code = i32::from(code ^ 0x55);
    let segment = (code & 0x70) >> 4;
    let mut magnitude = (code & 0x0F) << 4;
    match segment {
        0 => magnitude += 8,
        1 => magnitude += 0x108,
        _ => magnitude = (magnitude + 0x108) << (segment - 1),
    }
    (if code & 0x80 != 0 {
        magnitude
    } else {
        -magnitude
    }) as i16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_comes_back_within_the_laws_step() {
        for format in [AudioFormat::G711Ulaw, AudioFormat::G711Alaw] {
            for sample in (-32_000i16..=32_000).step_by(250) {
                let back = i32::from(match format {
                    AudioFormat::G711Ulaw => linear_from_ulaw(encode(format, sample)),
                    _ => linear_from_alaw(encode(format, sample)),
                });
                // The quantisation step grows with the magnitude: 1/16 of it at most,
                // plus the smallest step.
                let bound = i32::from(sample).abs() / 16 + 16;
                assert!(
                    (back - i32::from(sample)).abs() <= bound,
                    "{format:?}: {sample} came back {back}"
                );
            }
        }
    }

    #[test]
    fn silence_is_quiet_and_a_loud_sample_is_loud() {
        for format in [AudioFormat::G711Ulaw, AudioFormat::G711Alaw] {
            assert!(peak(format, &[encode(format, 0); 8]) < 16, "{format:?}");
            assert!(peak(format, &[encode(format, -6000)]) > 5000, "{format:?}");
        }
    }
}
