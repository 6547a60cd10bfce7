//! The latency distributions as a chart (SVG): one line per series, the share of samples (y) at or under
//! each latency (x, logarithmic), so medians, tails and how series differ read at a glance.

use std::time::Duration;

use super::BenchError;

use plotters::prelude::*;

/// Colours for the series, in order (then again).
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// An SVG of the cumulative distributions of `series` (name, samples), latencies in milliseconds.
pub fn cdf_svg(title: &str, series: &[(String, Vec<Duration>)]) -> Result<String, BenchError> {
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let all = series.iter().flat_map(|(_, s)| s.iter().map(ms));
    let (low, high) = all.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if low > high {
        return Err(BenchError::Output("no samples to chart".into()));
    }
    let (low, high) = ((low * 0.8).max(1e-3), (high * 1.25).max(low * 2.0));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 520)).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| BenchError::Output(e.to_string()))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(56)
            .build_cartesian_2d((low..high).log_scale(), 0.0..100.0)
            .map_err(|e| BenchError::Output(e.to_string()))?;
        chart
            .configure_mesh()
            .x_desc("latency (ms, log scale)")
            .y_desc("samples at or under it (%)")
            .draw()
            .map_err(|e| BenchError::Output(e.to_string()))?;
        for (i, (name, samples)) in series.iter().enumerate() {
            let mut sorted: Vec<f64> = samples.iter().map(ms).collect();
            sorted.sort_by(f64::total_cmp);
            let n = sorted.len() as f64;
            // At most ~400 points a line: the SVG stays small whatever the sample count.
            let step = (sorted.len() / 400).max(1);
            let points = sorted
                .iter()
                .enumerate()
                .filter(|(k, _)| k % step == 0 || *k + 1 == sorted.len())
                .map(|(k, v)| (*v, (k + 1) as f64 * 100.0 / n));
            let colour = COLOURS[i % COLOURS.len()];
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)))
                .map_err(|e| BenchError::Output(e.to_string()))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| BenchError::Output(e.to_string()))?;
        root.present()
            .map_err(|e| BenchError::Output(e.to_string()))?;
    }
    Ok(svg)
}
