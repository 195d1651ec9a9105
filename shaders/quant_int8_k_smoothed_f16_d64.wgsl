enable f16;@group(0)
@binding(0)
var<storage, read_write> buffer_0_global: array<vec4<f16>>;

@group(0)
@binding(1)
var<storage, read_write> buffer_1_global: array<u32>;

@group(0)
@binding(2)
var<storage, read_write> buffer_2_global: array<f32>;

@group(0)
@binding(3)
var<storage, read_write> buffer_3_global: array<vec4<f32>>;

@group(0)
@binding(4)
var<storage, read_write> buffer_4_global: array<f32>;

struct info_st {
   scalars_f32: array<f32, 2>,
   scalars_u32: array<u32, 8>,
   static_meta: array<u32, 10>,
}

@group(0)
@binding(5)
var<storage, read> info: info_st;

var<workgroup> shared_memory_10: array<f32, 256>;

var<workgroup> shared_memory_11: array<f32, 1>;

const WORKGROUP_SIZE_X = 128u;
const WORKGROUP_SIZE_Y = 1u;
const WORKGROUP_SIZE_Z = 1u;

@compute
@workgroup_size(128, 1, 1)
fn quantize_rows_e__n_4(
    @builtin(local_invocation_index) local_idx: u32,
    @builtin(workgroup_id) workgroup_id: vec3<u32>,
) {
var l_mut_100: u32;
var l_mut_104: u32;
var l_mut_16: f32;
var l_mut_184: u32;
var l_mut_27: vec4<f32>;
var l_mut_95: u32;
let l_0 = local_idx % u32(8);
let l_1 = local_idx / u32(8);
let l_2 = workgroup_id.x * u32(32);
let l_3 = workgroup_id.z * info.scalars_u32[3];
let l_4 = workgroup_id.y * info.scalars_u32[4];
let l_5 = l_3 + l_4;
let l_6 = workgroup_id.z * info.scalars_u32[7];
let l_7 = workgroup_id.y / info.scalars_u32[6];
let l_8 = l_6 + l_7;
let l_9 = l_8 * u32(16);

for (var l_mut_12: u32 = u32(0); l_mut_12 < u32(2); l_mut_12++) {
let l_13 = l_mut_12 * u32(16);
let l_14 = l_13 + l_1;
let l_15 = l_2 + l_14;
l_mut_16 = f32(0.0);
let l_17 = l_14 < u32(32);
let l_18 = l_15 < info.scalars_u32[0];
let l_19 = l_17 && l_18;
if l_19 {
let l_20 = l_15 * info.scalars_u32[5];
let l_21 = l_5 + l_20;

for (var l_mut_22: u32 = l_0; l_mut_22 < u32(16); l_mut_22 += u32(8)) {
let l_23 = l_21 / u32(4);
let l_24 = l_23 + l_mut_22;
let l_25 = buffer_0_global[l_24];
let l_26 = vec4<f32>(l_25);
l_mut_27 = l_26;
let l_28 = l_9 + l_mut_22;
let l_29 = buffer_3_global[l_28];
l_mut_27 = l_mut_27 - l_29;
let l_30 = l_mut_27[u32(0)];
let l_31 = abs(l_30);
let l_32 = max(l_mut_16, l_31);
l_mut_16 = l_32;
let l_33 = l_mut_27[u32(1)];
let l_34 = abs(l_33);
let l_35 = max(l_mut_16, l_34);
l_mut_16 = l_35;
let l_36 = l_mut_27[u32(2)];
let l_37 = abs(l_36);
let l_38 = max(l_mut_16, l_37);
l_mut_16 = l_38;
let l_39 = l_mut_27[u32(3)];
let l_40 = abs(l_39);
let l_41 = max(l_mut_16, l_40);
l_mut_16 = l_41;
}
}
let l_42 = l_14 * u32(8);
let l_43 = l_42 + l_0;
shared_memory_10[l_43] = l_mut_16;
}
workgroupBarrier();

for (var l_mut_44: u32 = local_idx; l_mut_44 < u32(1); l_mut_44 += u32(128)) {
l_mut_16 = f32(0.0);
let l_45 = l_mut_44 * u32(32);
let l_46 = l_mut_44 * u32(32);
let l_47 = l_46 + u32(32);

for (var l_mut_48: u32 = l_45; l_mut_48 < l_47; l_mut_48++) {
let l_49 = l_mut_48 * u32(8);
let l_50 = l_49 + u32(0);
let l_51 = shared_memory_10[l_50];
let l_52 = max(l_mut_16, l_51);
l_mut_16 = l_52;
let l_53 = l_mut_48 * u32(8);
let l_54 = l_53 + u32(1);
let l_55 = shared_memory_10[l_54];
let l_56 = max(l_mut_16, l_55);
l_mut_16 = l_56;
let l_57 = l_mut_48 * u32(8);
let l_58 = l_57 + u32(2);
let l_59 = shared_memory_10[l_58];
let l_60 = max(l_mut_16, l_59);
l_mut_16 = l_60;
let l_61 = l_mut_48 * u32(8);
let l_62 = l_61 + u32(3);
let l_63 = shared_memory_10[l_62];
let l_64 = max(l_mut_16, l_63);
l_mut_16 = l_64;
let l_65 = l_mut_48 * u32(8);
let l_66 = l_65 + u32(4);
let l_67 = shared_memory_10[l_66];
let l_68 = max(l_mut_16, l_67);
l_mut_16 = l_68;
let l_69 = l_mut_48 * u32(8);
let l_70 = l_69 + u32(5);
let l_71 = shared_memory_10[l_70];
let l_72 = max(l_mut_16, l_71);
l_mut_16 = l_72;
let l_73 = l_mut_48 * u32(8);
let l_74 = l_73 + u32(6);
let l_75 = shared_memory_10[l_74];
let l_76 = max(l_mut_16, l_75);
l_mut_16 = l_76;
let l_77 = l_mut_48 * u32(8);
let l_78 = l_77 + u32(7);
let l_79 = shared_memory_10[l_78];
let l_80 = max(l_mut_16, l_79);
l_mut_16 = l_80;
}
let l_81 = l_mut_16 > f32(0.0);
let l_82 = bitcast<u32>(l_mut_16);
let l_83 = l_82 & u32(2147483648);
let l_84 = l_82 >> u32(23);
let l_85 = l_84 & u32(255);
let l_86 = u32(1123942400) >> u32(23);
let l_87 = l_86 & u32(255);
let l_88 = l_82 & u32(8388607);
let l_89 = l_88 | u32(8388608);
let l_90 = u32(1123942400) & u32(8388607);
let l_91 = l_90 | u32(8388608);
let l_92 = l_89 < l_91;
let l_93 = select(u32(0), u32(1), l_92);
let l_94 = l_89 << l_93;
l_mut_95 = l_94;
let l_96 = l_85 + u32(127);
let l_97 = l_96 + u32(256);
let l_98 = l_97 - l_87;
let l_99 = l_98 - l_93;
l_mut_100 = u32(0);

for (var l_mut_101: u32 = u32(0); l_mut_101 < u32(25); l_mut_101++) {
l_mut_100 = l_mut_100 << u32(1);
let l_102 = l_mut_95 >= l_91;
if l_102 {
l_mut_95 = l_mut_95 - l_91;
l_mut_100 = l_mut_100 | u32(1);
}
l_mut_95 = l_mut_95 << u32(1);
}
let l_103 = l_mut_100 >> u32(1);
l_mut_104 = l_103;
let l_105 = l_mut_100 & u32(1);
let l_106 = l_105 == u32(1);
let l_107 = l_mut_95 != u32(0);
let l_108 = l_mut_104 & u32(1);
let l_109 = l_108 == u32(1);
let l_110 = l_107 || l_109;
let l_111 = l_106 && l_110;
let l_112 = select(u32(0), u32(1), l_111);
l_mut_104 = l_mut_104 + l_112;
let l_113 = l_mut_104 >> u32(24);
l_mut_104 = l_mut_104 >> l_113;
let l_114 = l_99 + l_113;
let l_115 = l_85 != u32(0);
let l_116 = l_114 >= u32(257);
let l_117 = l_115 && l_116;
let l_118 = l_114 <= u32(510);
let l_119 = l_117 && l_118;
let l_120 = l_114 - u32(256);
let l_121 = l_120 << u32(23);
let l_122 = l_83 | l_121;
let l_123 = l_mut_104 & u32(8388607);
let l_124 = l_122 | l_123;
let l_125 = select(l_83, l_124, l_119);
let l_126 = bitcast<f32>(l_125);
let l_127 = select(f32(1.0), l_126, l_81);
shared_memory_11[l_mut_44] = l_127;
let l_128 = workgroup_id.z * info.scalars_u32[1];
let l_129 = l_128 + workgroup_id.y;
let l_130 = l_129 * info.scalars_u32[2];
let l_131 = l_130 + workgroup_id.x;
let l_132 = l_131 * u32(1);
let l_133 = l_132 + l_mut_44;
let l_134 = l_127 * info.scalars_f32[0];
buffer_2_global[l_133] = l_134;
}
workgroupBarrier();

for (var l_mut_135: u32 = u32(0); l_mut_135 < u32(2); l_mut_135++) {
let l_136 = l_mut_135 * u32(16);
let l_137 = l_136 + l_1;
let l_138 = l_2 + l_137;
let l_139 = l_137 < u32(32);
let l_140 = l_138 < info.scalars_u32[0];
let l_141 = l_139 && l_140;
if l_141 {
l_mut_104 = u32(0);
let l_142 = shared_memory_11[l_mut_104];
let l_143 = f32(1.0) / l_142;
let l_144 = l_138 * info.scalars_u32[5];
let l_145 = l_5 + l_144;

for (var l_mut_146: u32 = l_0; l_mut_146 < u32(16); l_mut_146 += u32(8)) {
let l_147 = l_145 / u32(4);
let l_148 = l_147 + l_mut_146;
let l_149 = buffer_0_global[l_148];
let l_150 = vec4<f32>(l_149);
l_mut_27 = l_150;
let l_151 = l_9 + l_mut_146;
let l_152 = buffer_3_global[l_151];
l_mut_27 = l_mut_27 - l_152;
l_mut_104 = u32(0);

for (var l_mut_153: u32 = u32(0); l_mut_153 < u32(4); l_mut_153++) {
let l_154 = l_mut_27[l_mut_153];
let l_155 = abs(l_154);
let l_156 = l_155 * l_143;
l_mut_16 = l_156;
let l_157 = floor(l_156);
let l_158 = l_156 - l_157;
let l_159 = l_158 - f32(0.5);
let l_160 = abs(l_159);
let l_161 = l_160 < f32(6.103515625e-5);
if l_161 {
let l_162 = abs(l_154);
let l_163 = bitcast<u32>(l_142);
let l_164 = bitcast<u32>(l_162);
let l_165 = l_164 & u32(2147483648);
let l_166 = l_164 >> u32(23);
let l_167 = l_166 & u32(255);
let l_168 = l_163 >> u32(23);
let l_169 = l_168 & u32(255);
let l_170 = l_164 & u32(8388607);
let l_171 = l_170 | u32(8388608);
let l_172 = l_163 & u32(8388607);
let l_173 = l_172 | u32(8388608);
let l_174 = l_171 < l_173;
let l_175 = select(u32(0), u32(1), l_174);
let l_176 = l_171 << l_175;
l_mut_100 = l_176;
let l_177 = l_167 + u32(127);
let l_178 = l_177 + u32(256);
let l_179 = l_178 - l_169;
let l_180 = l_179 - l_175;
l_mut_95 = u32(0);

for (var l_mut_181: u32 = u32(0); l_mut_181 < u32(25); l_mut_181++) {
l_mut_95 = l_mut_95 << u32(1);
let l_182 = l_mut_100 >= l_173;
if l_182 {
l_mut_100 = l_mut_100 - l_173;
l_mut_95 = l_mut_95 | u32(1);
}
l_mut_100 = l_mut_100 << u32(1);
}
let l_183 = l_mut_95 >> u32(1);
l_mut_184 = l_183;
let l_185 = l_mut_95 & u32(1);
let l_186 = l_185 == u32(1);
let l_187 = l_mut_100 != u32(0);
let l_188 = l_mut_184 & u32(1);
let l_189 = l_188 == u32(1);
let l_190 = l_187 || l_189;
let l_191 = l_186 && l_190;
let l_192 = select(u32(0), u32(1), l_191);
l_mut_184 = l_mut_184 + l_192;
let l_193 = l_mut_184 >> u32(24);
l_mut_184 = l_mut_184 >> l_193;
let l_194 = l_180 + l_193;
let l_195 = l_167 != u32(0);
let l_196 = l_194 >= u32(257);
let l_197 = l_195 && l_196;
let l_198 = l_194 <= u32(510);
let l_199 = l_197 && l_198;
let l_200 = l_194 - u32(256);
let l_201 = l_200 << u32(23);
let l_202 = l_165 | l_201;
let l_203 = l_mut_184 & u32(8388607);
let l_204 = l_202 | l_203;
let l_205 = select(l_165, l_204, l_199);
let l_206 = bitcast<f32>(l_205);
l_mut_16 = l_206;
}
let l_207 = round(l_mut_16);
let l_208 = min(l_207, f32(127.0));
let l_209 = l_154 < f32(0.0);
let l_210 = -l_208;
let l_211 = select(l_208, l_210, l_209);
let l_212 = l_211 < f32(0.0);
let l_213 = l_211 + f32(256.0);
let l_214 = select(l_211, l_213, l_212);
let l_215 = u32(l_214);
let l_216 = u32(8) * l_mut_153;
let l_217 = l_215 << l_216;
l_mut_104 = l_mut_104 | l_217;
}
let l_218 = l_145 / u32(4);
let l_219 = l_218 + l_mut_146;
buffer_1_global[l_219] = l_mut_104;
}
}
}
}
